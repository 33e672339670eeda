//! The fuzz targets' bodies, one module per target (the binaries in
//! `fuzz_targets/` only call `run`). Each checks more than "no panic" where
//! that is cheap; the properties are on each module.
//!
//! Several targets take their input in [`parts`]: little-endian `u16`
//! lengths, each followed by that many bytes, so one input can carry a
//! request and several plugin responses.

pub mod adjust;
pub mod adjuster_config;
pub mod alloc;
pub mod merge;
pub mod mux_frames;
pub mod nri_messages;
pub mod shim_config;

/// Every allocation goes through the counter, so targets can bound what
/// one input makes the code under test allocate.
#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// Splits `data` into parts, each a little-endian `u16` length and that
/// many bytes; a length running past the end takes what is left.
pub fn parts(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let len = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        let body = &rest[2..];
        let n = len.min(body.len());
        out.push(&body[..n]);
        rest = &body[n..];
    }
    out
}

/// The inverse of [`parts`] (for seeds).
///
/// # Panics
/// If a part is longer than `u16::MAX` bytes.
pub fn join_parts(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        let len = u16::try_from(p.len()).expect("part of at most 65535 bytes");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// The OCI spec of the repository's busybox fixture, the base spec of the
/// targets that need one.
pub fn busybox_spec() -> oci_spec::runtime::Spec {
    serde_json::from_str(include_str!("../../testdata/oci/busybox.json")).expect("testdata/oci/busybox.json parses")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip() {
        let p: [&[u8]; 3] = [b"ab", b"", b"xyz"];
        assert_eq!(parts(&join_parts(&p)), p);
        // A length past the end takes the rest.
        assert_eq!(parts(&[9, 0, 1, 2]), vec![&[1u8, 2][..]]);
    }
}
