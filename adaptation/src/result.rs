//! Merging plugin responses (interim: accumulates without conflict checks;
//! replaced by the full NRI merge with ownership).

use nri_proto::api;

/// Conflicting or disallowed plugin adjustments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// Two plugins set the same field.
    #[error("plugins {first:?} and {second:?} both tried to set {field}")]
    Conflict {
        /// Plugin that set it first.
        first: String,
        /// Plugin that tried again.
        second: String,
        /// Field (and key).
        field: String,
    },
}

/// Accumulates CreateContainer responses.
pub struct CreateResult {
    request: api::CreateContainerRequest,
    reply: api::CreateContainerResponse,
}

impl CreateResult {
    /// Starts from the runtime's request.
    pub fn new(request: api::CreateContainerRequest) -> Self {
        CreateResult {
            request,
            reply: api::CreateContainerResponse::new(),
        }
    }
    /// The request as the next plugin sees it.
    pub fn request(&self) -> &api::CreateContainerRequest {
        &self.request
    }
    /// Merges one plugin's response.
    pub fn apply(
        &mut self,
        _plugin: &str,
        rsp: api::CreateContainerResponse,
    ) -> Result<(), MergeError> {
        let adj = self.reply.adjust.mut_or_insert_default();
        if let Some(a) = rsp.adjust.into_option() {
            adj.env.extend(a.env);
            adj.annotations.extend(a.annotations);
        }
        self.reply.update.extend(rsp.update);
        Ok(())
    }
    /// The merged response.
    pub fn into_response(self) -> api::CreateContainerResponse {
        self.reply
    }
}

/// Accumulates UpdateContainer / StopContainer updates.
pub struct UpdateResult {
    request: api::UpdateContainerRequest,
    updates: Vec<api::ContainerUpdate>,
}

impl UpdateResult {
    /// For UpdateContainer.
    pub fn for_update(request: api::UpdateContainerRequest) -> Self {
        UpdateResult {
            request,
            updates: Vec::new(),
        }
    }
    /// For StopContainer.
    pub fn for_stop(_req: &api::StopContainerRequest) -> Self {
        UpdateResult {
            request: api::UpdateContainerRequest::new(),
            updates: Vec::new(),
        }
    }
    /// The request as the next plugin sees it.
    pub fn update_request(&self) -> &api::UpdateContainerRequest {
        &self.request
    }
    /// Merges one plugin's updates.
    pub fn apply(
        &mut self,
        _plugin: &str,
        updates: Vec<api::ContainerUpdate>,
    ) -> Result<(), MergeError> {
        self.updates.extend(updates);
        Ok(())
    }
    /// The merged updates.
    pub fn into_updates(self) -> Vec<api::ContainerUpdate> {
        self.updates
    }
}
