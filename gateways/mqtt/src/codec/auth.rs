//! The AUTH packet (MQTT 5 section 3.15, enhanced authentication), which
//! `mqttbytes` 0.6 does not know: read and written here, in its model's style.

use bytes::{BufMut, Bytes, BytesMut};

use super::CodecError;

/// AUTH reason 0x00: authentication succeeded (server, after a re-authentication).
pub const SUCCESS: u8 = 0x00;
/// AUTH reason 0x18: continue the exchange.
pub const CONTINUE: u8 = 0x18;
/// AUTH reason 0x19: the client starts a re-authentication.
pub const REAUTHENTICATE: u8 = 0x19;

/// One AUTH packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthPacket {
    pub reason: u8,
    pub method: Option<String>,
    pub data: Option<Bytes>,
    pub reason_string: Option<String>,
    pub user_properties: Vec<(String, String)>,
}

impl AuthPacket {
    pub fn new(reason: u8, method: &str, data: Vec<u8>) -> AuthPacket {
        AuthPacket {
            reason,
            method: Some(method.to_owned()),
            data: Some(Bytes::from(data)),
            reason_string: None,
            user_properties: Vec::new(),
        }
    }
}

/// Reads an AUTH's variable header (`body`: everything after the fixed header).
/// A remaining length of 0 is reason 0x00 without properties (MQTT 5 3.15.2.1).
pub fn read(body: &[u8]) -> Result<AuthPacket, CodecError> {
    let bad = |why: &str| CodecError::Malformed(format!("AUTH: {why}"));
    let mut p = AuthPacket {
        reason: SUCCESS,
        method: None,
        data: None,
        reason_string: None,
        user_properties: Vec::new(),
    };
    let Some((&reason, mut r)) = body.split_first() else {
        return Ok(p);
    };
    if !matches!(reason, SUCCESS | CONTINUE | REAUTHENTICATE) {
        // MQTT-3.15.2-1: only the Authenticate Reason Codes.
        return Err(bad(&format!("reason code {reason:#04x}")));
    }
    p.reason = reason;
    if r.is_empty() {
        return Ok(p);
    }
    let take = |r: &mut &[u8], n: usize| -> Result<Vec<u8>, CodecError> {
        if r.len() < n {
            return Err(CodecError::Malformed("AUTH: cut short".into()));
        }
        let (a, b) = r.split_at(n);
        *r = b;
        Ok(a.to_vec())
    };
    let mut props_len = 0usize;
    for i in 0.. {
        if i == 4 {
            return Err(bad("property length longer than 4 bytes"));
        }
        let b = take(&mut r, 1)?[0];
        props_len |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            break;
        }
    }
    let mut props = &take(&mut r, props_len)?[..];
    if !r.is_empty() {
        return Err(bad("bytes after the properties"));
    }
    let binary = |r: &mut &[u8]| -> Result<Vec<u8>, CodecError> {
        let len = take(r, 2)?;
        take(r, usize::from(u16::from_be_bytes([len[0], len[1]])))
    };
    let string = |r: &mut &[u8]| -> Result<String, CodecError> {
        String::from_utf8(binary(r)?).map_err(|_| bad("a string is not UTF-8"))
    };
    while !props.is_empty() {
        let id = take(&mut props, 1)?[0];
        let twice = || bad(&format!("property {id:#04x} given twice"));
        match id {
            0x15 => {
                let v = string(&mut props)?;
                if p.method.replace(v).is_some() {
                    return Err(twice());
                }
            }
            0x16 => {
                let v = Bytes::from(binary(&mut props)?);
                if p.data.replace(v).is_some() {
                    return Err(twice());
                }
            }
            0x1F => {
                let v = string(&mut props)?;
                if p.reason_string.replace(v).is_some() {
                    return Err(twice());
                }
            }
            0x26 => {
                let k = string(&mut props)?;
                let v = string(&mut props)?;
                p.user_properties.push((k, v));
            }
            other => return Err(bad(&format!("property {other:#04x} is not allowed"))),
        }
    }
    Ok(p)
}

/// Appends a whole AUTH packet (fixed header included).
pub fn write(p: &AuthPacket, out: &mut BytesMut) -> Result<(), CodecError> {
    fn put(v: &[u8], props: &mut BytesMut) -> Result<(), CodecError> {
        let len = u16::try_from(v.len())
            .map_err(|_| CodecError::Malformed("AUTH: a property over 65,535 bytes".into()))?;
        props.put_u16(len);
        props.extend_from_slice(v);
        Ok(())
    }
    let mut props = BytesMut::new();
    if let Some(m) = &p.method {
        props.put_u8(0x15);
        put(m.as_bytes(), &mut props)?;
    }
    if let Some(d) = &p.data {
        props.put_u8(0x16);
        put(d, &mut props)?;
    }
    if let Some(s) = &p.reason_string {
        props.put_u8(0x1F);
        put(s.as_bytes(), &mut props)?;
    }
    for (k, v) in &p.user_properties {
        props.put_u8(0x26);
        put(k.as_bytes(), &mut props)?;
        put(v.as_bytes(), &mut props)?;
    }
    let mut body = BytesMut::with_capacity(props.len() + 6);
    if p.reason != SUCCESS || !props.is_empty() {
        body.put_u8(p.reason);
        write_varint(props.len(), &mut body);
        body.extend_from_slice(&props);
    }
    out.put_u8(0xF0);
    write_varint(body.len(), out);
    out.extend_from_slice(&body);
    Ok(())
}

fn write_varint(mut x: usize, out: &mut BytesMut) {
    loop {
        let byte = (x % 128) as u8;
        x /= 128;
        if x == 0 {
            out.put_u8(byte);
            return;
        }
        out.put_u8(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_packets_round_trip() {
        let full = AuthPacket {
            reason: CONTINUE,
            method: Some("SCRAM-SHA-256".into()),
            data: Some(Bytes::from_static(b"r=abc,s=c2FsdA==,i=4096")),
            reason_string: Some("why".into()),
            user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
        };
        let empty = AuthPacket {
            reason: SUCCESS,
            method: None,
            data: None,
            reason_string: None,
            user_properties: vec![],
        };
        for p in [full, empty, AuthPacket::new(REAUTHENTICATE, "M", vec![])] {
            let mut out = BytesMut::new();
            write(&p, &mut out).unwrap();
            assert_eq!(out[0], 0xF0);
            let back = read(&out[2..]).unwrap();
            assert_eq!(back, p);
        }
        // The short form: remaining length 0 is success; one byte is a reason alone.
        let mut out = BytesMut::new();
        write(
            &AuthPacket {
                reason: SUCCESS,
                method: None,
                data: None,
                reason_string: None,
                user_properties: vec![],
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(&out[..], &[0xF0, 0]);
        assert_eq!(read(&[0x18]).unwrap().reason, CONTINUE);
    }

    #[test]
    fn bad_auth_packets_are_malformed() {
        for bad in [
            &[0x87u8][..],                             // not an Authenticate Reason Code
            &[0x18, 3, 0x15, 0, 5][..],                // a string cut short
            &[0x18, 2, 0x24, 1][..],                   // a property AUTH may not carry
            &[0x18, 0, 9][..],                         // bytes after the properties
            &[0x18, 6, 0x15, 0, 1, b'a', 0x15, 0][..], // method twice (cut)
            &[0x18, 8, 0x15, 0, 1, b'a', 0x15, 0, 1, b'b'][..],
            &[0x18, 4, 0x15, 0, 1, 0xff][..],       // not UTF-8
            &[0x18, 0x80, 0x80, 0x80, 0x80, 1][..], // property length of five bytes
        ] {
            assert!(
                matches!(read(bad), Err(CodecError::Malformed(_))),
                "{bad:02x?}"
            );
        }
    }
}
