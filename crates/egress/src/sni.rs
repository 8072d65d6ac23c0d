//! Reads the server name out of a TLS ClientHello without terminating TLS, to stop domain
//! fronting through CONNECT tunnels.

/// What the first bytes of a tunnel turned out to be.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// Need more bytes.
    Incomplete,
    /// Not a TLS handshake at all.
    NotTls,
    /// A complete ClientHello, with its server name if it sent one.
    Tls(Option<String>),
    Malformed,
}

/// Largest ClientHello we buffer (post-quantum key shares make them a few KiB).
pub const MAX_HELLO: usize = 64 * 1024;

pub fn parse(buf: &[u8]) -> Hello {
    if buf.is_empty() {
        return Hello::Incomplete;
    }
    if buf[0] != 0x16 {
        return Hello::NotTls;
    }
    // Reassemble the handshake message from as many records as it spans.
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        if rest.len() < 5 {
            return Hello::Incomplete;
        }
        if rest[0] != 0x16 || rest[1] != 3 {
            return Hello::Malformed;
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if rest.len() < 5 + len {
            return Hello::Incomplete;
        }
        handshake.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
        if handshake.len() >= 4 {
            if handshake[0] != 1 {
                return Hello::Malformed;
            }
            let body_len = (usize::from(handshake[1]) << 16) | (usize::from(handshake[2]) << 8) | usize::from(handshake[3]);
            if body_len + 4 > MAX_HELLO {
                return Hello::Malformed;
            }
            if handshake.len() >= body_len + 4 {
                return match server_name(&handshake[4..4 + body_len]) {
                    Some(name) => Hello::Tls(name),
                    None => Hello::Malformed,
                };
            }
        }
    }
}

/// A tiny cursor that fails (returns `None`) instead of panicking on short input.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
}

/// `Some(None)`: well-formed without SNI; `None`: malformed.
fn server_name(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // version, random
    let n = r.u8()?;
    r.take(n)?; // session id
    let n = r.u16()?;
    r.take(n)?; // cipher suites
    let n = r.u8()?;
    r.take(n)?; // compression
    if r.0.is_empty() {
        return Some(None);
    }
    let n = r.u16()?;
    let mut ext = Reader(r.take(n)?);
    while !ext.0.is_empty() {
        let kind = ext.u16()?;
        let n = ext.u16()?;
        let data = ext.take(n)?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(data);
        let n = list.u16()?;
        let mut names = Reader(list.take(n)?);
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let n = names.u16()?;
            let name = names.take(n)?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(Some(name.to_ascii_lowercase()));
            }
        }
        return Some(None);
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello carrying `sni`, split into records of `record` bytes.
    pub fn hello(sni: Option<&str>, record: usize) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([0u8; 32]);
        body.push(0);
        body.extend([0, 2, 0x13, 0x01]);
        body.extend([1, 0]);
        let mut exts = Vec::new();
        if let Some(name) = sni {
            let n = name.len() as u16;
            exts.extend([0, 0]);
            exts.extend((n + 5).to_be_bytes());
            exts.extend((n + 3).to_be_bytes());
            exts.push(0);
            exts.extend(n.to_be_bytes());
            exts.extend(name.as_bytes());
        }
        body.extend((exts.len() as u16).to_be_bytes());
        body.extend(exts);
        let mut hs = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
        hs.extend(body);
        let mut out = Vec::new();
        for chunk in hs.chunks(record) {
            out.extend([0x16, 3, 1]);
            out.extend((chunk.len() as u16).to_be_bytes());
            out.extend(chunk);
        }
        out
    }

    #[test]
    fn finds_sni_across_records_and_rejects_garbage() {
        assert_eq!(parse(&hello(Some("API.example.com"), 1000)), Hello::Tls(Some("api.example.com".into())));
        assert_eq!(parse(&hello(Some("a.example.com"), 7)), Hello::Tls(Some("a.example.com".into())));
        assert_eq!(parse(&hello(None, 1000)), Hello::Tls(None));
        let full = hello(Some("x.com"), 1000);
        assert_eq!(parse(&full[..full.len() - 1]), Hello::Incomplete);
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        let mut bad = full.clone();
        bad[5] = 2; // not a ClientHello
        assert_eq!(parse(&bad), Hello::Malformed);
        // Truncated inner lengths never panic.
        for cut in 0..full.len() {
            let mut t = full[..cut].to_vec();
            if t.len() >= 5 {
                let len = (t.len() - 5) as u16;
                t[3..5].copy_from_slice(&len.to_be_bytes());
                let _ = parse(&t);
            }
        }
    }
}
