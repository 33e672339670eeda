//! `misbehave`: a WebAssembly plugin for the sandbox tests. Its
//! configuration names a request and what to do there, one a line:
//!
//! ```text
//! create_container loop     # never return
//! create_container alloc    # allocate until the allocator gives up
//! create_container panic    # panic (a trap, after the message on stderr)
//! create_container garbage  # answer bytes that are no protobuf message
//! create_container exit     # std::process::exit(7)
//! ```
//!
//! Subscribed to CreateContainer; every other request is answered empty.

mod abi;
mod pb;

use std::sync::Mutex;

use abi::Request;
use pb::{Reader, Writer};

static RULES: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

pub fn handle(req: Request, bytes: &[u8]) -> Result<Vec<u8>, String> {
    if req == Request::Configure {
        let text = Reader::string(bytes, 1)?;
        let mut rules = RULES.lock().unwrap();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            match line.split_once(' ') {
                Some((r, what)) => rules.push((r.to_string(), what.trim().to_string())),
                None => return Err(format!("cannot read {:?}", line)),
            }
        }
        let mut rsp = Writer::new();
        rsp.varint(2, 1 << (4 - 1));
        return Ok(rsp.buf);
    }
    let what = RULES
        .lock()
        .unwrap()
        .iter()
        .find(|(r, _)| r == req.export())
        .map(|(_, w)| w.clone());
    match what.as_deref() {
        Some("loop") => loop {
            unsafe { std::ptr::read_volatile(&0u8) };
        },
        Some("alloc") => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
            }
        }
        Some("panic") => panic!("misbehave: told to panic in {}", req.export()),
        Some("garbage") => Ok(vec![0xff; 16]),
        Some("exit") => std::process::exit(7),
        _ => Ok(Vec::new()),
    }
}
