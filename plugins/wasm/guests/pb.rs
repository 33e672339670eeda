//! A small protobuf codec for the guests: just what they read and write of
//! the NRI messages (varints, length-delimited fields, nested messages).
//! Field numbers are those of `proto/proto/api.proto`.
//!
//! Written for Rust 1.63 (Debian 12's rustc, which has the wasm32-wasi
//! standard library as a package), with no dependencies.

/// One field's value as it appears on the wire.
pub enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

impl<'a> Value<'a> {
    /// The bytes of a length-delimited field (string, bytes, message).
    pub fn bytes(&self) -> Result<&'a [u8], String> {
        match *self {
            Value::Bytes(b) => Ok(b),
            _ => Err("expected a length-delimited field".to_string()),
        }
    }

    /// A string field.
    pub fn string(&self) -> Result<&'a str, String> {
        std::str::from_utf8(self.bytes()?).map_err(|e| format!("string field is not UTF-8: {}", e))
    }

}

/// The fields of one encoded message, in wire order.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let (&b, rest) = self.buf.split_first().ok_or("truncated varint")?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".to_string())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.buf.len() {
            return Err(format!("field of {} bytes runs past the message's end", n));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// The next field number and value; `None` at the end.
    pub fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>, String> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = (key >> 3) as u32;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Value::Fixed64(u64::from_le_bytes(a))
            }
            2 => {
                let n = self.varint()? as usize;
                Value::Bytes(self.take(n)?)
            }
            5 => {
                let b = self.take(4)?;
                let mut a = [0u8; 4];
                a.copy_from_slice(b);
                Value::Fixed32(u32::from_le_bytes(a))
            }
            t => return Err(format!("unsupported wire type {} of field {}", t, field)),
        };
        Ok(Some((field, value)))
    }

    /// Calls `f` for every field whose number is `want`.
    pub fn each<F: FnMut(Value<'a>) -> Result<(), String>>(buf: &'a [u8], want: u32, mut f: F) -> Result<(), String> {
        let mut r = Reader::new(buf);
        while let Some((field, value)) = r.next_field()? {
            if field == want {
                f(value)?;
            }
        }
        Ok(())
    }

    /// The last field numbered `want` (proto3: the last one wins), if any.
    pub fn find(buf: &'a [u8], want: u32) -> Result<Option<Value<'a>>, String> {
        let mut found = None;
        Reader::each(buf, want, |v| {
            found = Some(v);
            Ok(())
        })?;
        Ok(found)
    }

    /// A string field, empty when absent.
    pub fn string(buf: &'a [u8], want: u32) -> Result<&'a str, String> {
        match Reader::find(buf, want)? {
            Some(v) => v.string(),
            None => Ok(""),
        }
    }

    /// A message field, empty when absent.
    pub fn message(buf: &'a [u8], want: u32) -> Result<&'a [u8], String> {
        match Reader::find(buf, want)? {
            Some(v) => v.bytes(),
            None => Ok(&[]),
        }
    }

    /// The entries of a `map<string, string>` field.
    pub fn string_map(buf: &'a [u8], want: u32) -> Result<Vec<(&'a str, &'a str)>, String> {
        let mut out = Vec::new();
        Reader::each(buf, want, |entry| {
            let entry = entry.bytes()?;
            out.push((Reader::string(entry, 1)?, Reader::string(entry, 2)?));
            Ok(())
        })?;
        Ok(out)
    }
}

/// Builds one encoded message.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    fn raw_varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    /// A varint field (int32, int64, uint32, uint64, bool, enum); written
    /// even when zero, as a field of an Optional* wrapper must be.
    pub fn varint(&mut self, field: u32, v: u64) -> &mut Writer {
        self.raw_varint(u64::from(field) << 3);
        self.raw_varint(v);
        self
    }

    /// A length-delimited field.
    pub fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Writer {
        self.raw_varint(u64::from(field) << 3 | 2);
        self.raw_varint(b.len() as u64);
        self.buf.extend_from_slice(b);
        self
    }

    /// A string field.
    pub fn string(&mut self, field: u32, s: &str) -> &mut Writer {
        self.bytes(field, s.as_bytes())
    }

    /// A nested message field.
    pub fn message(&mut self, field: u32, m: &Writer) -> &mut Writer {
        self.bytes(field, &m.buf)
    }

    /// One entry of a `map<string, string>` field.
    pub fn map_entry(&mut self, field: u32, key: &str, value: &str) -> &mut Writer {
        let mut e = Writer::new();
        e.string(1, key).string(2, value);
        self.message(field, &e)
    }
}
