//! The name a verified client certificate stands for: its subject's common name
//! (CN), else its first DNS or e-mail subject alternative name. A few dozen lines of
//! DER walking instead of a full X.509 parser: only the subject and the SAN
//! extension are read, and only after rustls has verified the certificate.

use rustls_pki_types::CertificateDer;

const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_SAN: &[u8] = &[0x55, 0x1d, 0x11];

/// The identity of a certificate (see the module docs); `None` when it names
/// nothing usable.
pub fn name(cert: &CertificateDer<'_>) -> Option<String> {
    let (tbs, sans) = parts(cert.as_ref())?;
    common_name(tbs).or_else(|| sans.and_then(first_san))
}

/// One DER element: (tag, contents, what follows).
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The subject Name and the SAN extension's value of a certificate.
fn parts(der: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let (0x30, cert, _) = tlv(der)? else {
        return None;
    };
    let (0x30, mut tbs, _) = tlv(cert)? else {
        return None;
    };
    // [0] version (optional), serial, signature algorithm, issuer, validity, subject.
    let mut fields = Vec::with_capacity(10);
    while !tbs.is_empty() {
        let (tag, body, rest) = tlv(tbs)?;
        fields.push((tag, body));
        tbs = rest;
    }
    let skip = usize::from(fields.first()?.0 == 0xa0);
    let subject = fields.get(skip + 4).filter(|f| f.0 == 0x30)?.1;
    let sans = fields
        .iter()
        .find(|f| f.0 == 0xa3)
        .and_then(|ext| san_extension(ext.1));
    Some((subject, sans))
}

fn san_extension(explicit: &[u8]) -> Option<&[u8]> {
    let (0x30, mut list, _) = tlv(explicit)? else {
        return None;
    };
    while !list.is_empty() {
        let (_, ext, rest) = tlv(list)?;
        list = rest;
        let (0x06, oid, mut more) = tlv(ext)? else {
            continue;
        };
        if oid != OID_SAN {
            continue;
        }
        // An optional `critical` BOOLEAN, then the OCTET STRING.
        let (mut tag, mut value, after) = tlv(more)?;
        if tag == 0x01 {
            more = after;
            (tag, value, _) = tlv(more)?;
        }
        return (tag == 0x04).then_some(value);
    }
    None
}

fn common_name(mut subject: &[u8]) -> Option<String> {
    while !subject.is_empty() {
        let (_, set, rest) = tlv(subject)?;
        subject = rest;
        let mut set = set;
        while !set.is_empty() {
            let (_, atv, rest) = tlv(set)?;
            set = rest;
            let (0x06, oid, value) = tlv(atv)? else {
                continue;
            };
            if oid == OID_CN {
                let (tag, text, _) = tlv(value)?;
                return string(tag, text).filter(|s| !s.is_empty());
            }
        }
    }
    None
}

fn first_san(value: &[u8]) -> Option<String> {
    let (0x30, mut names, _) = tlv(value)? else {
        return None;
    };
    while !names.is_empty() {
        let (tag, text, rest) = tlv(names)?;
        names = rest;
        // [1] rfc822Name, [2] dNSName: IA5String, implicitly tagged.
        if (tag == 0x81 || tag == 0x82)
            && let Some(s) = string(0x16, text)
        {
            return Some(s);
        }
    }
    None
}

fn string(tag: u8, bytes: &[u8]) -> Option<String> {
    match tag {
        // UTF8String, PrintableString, IA5String, TeletexString (ASCII in practice).
        0x0c | 0x13 | 0x16 | 0x14 => std::str::from_utf8(bytes).ok().map(str::to_owned),
        // BMPString: UCS-2 big endian.
        0x1e if bytes.len().is_multiple_of(2) => {
            let units: Vec<u16> = bytes
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    fn cert(cn: Option<&str>, sans: Vec<SanType>) -> CertificateDer<'static> {
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(DnType::OrganizationName, "rocketgate tests");
        if let Some(cn) = cn {
            p.distinguished_name.push(DnType::CommonName, cn);
        }
        p.subject_alt_names = sans;
        let key = KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn the_common_name_comes_first() {
        let c = cert(
            Some("device-17"),
            vec![SanType::DnsName("d17.example".try_into().unwrap())],
        );
        assert_eq!(name(&c).as_deref(), Some("device-17"));
    }

    #[test]
    fn without_a_common_name_the_first_dns_or_email_san() {
        let c = cert(
            None,
            vec![
                SanType::IpAddress([10, 0, 0, 1].into()),
                SanType::Rfc822Name("ops@example.com".try_into().unwrap()),
                SanType::DnsName("d17.example".try_into().unwrap()),
            ],
        );
        assert_eq!(name(&c).as_deref(), Some("ops@example.com"));
        let c = cert(
            None,
            vec![SanType::DnsName("d17.example".try_into().unwrap())],
        );
        assert_eq!(name(&c).as_deref(), Some("d17.example"));
    }

    #[test]
    fn no_name_and_garbage_are_none() {
        assert_eq!(name(&cert(None, vec![])), None);
        for bad in [
            &b""[..],
            b"\x30",
            b"\x30\x84\xff\xff\xff\xff",
            b"\x30\x03\x30\x01\x00",
        ] {
            assert_eq!(name(&CertificateDer::from(bad.to_vec())), None);
        }
    }
}
