//! Entry points for the fuzz targets in `fuzz/` (feature `fuzz`; not public API).

use crate::protocol;

/// Parses one text frame as the connection does. `Ok(op)` names the request's
/// kind; `Err(code)` is the error code the client would get.
pub fn parse_frame(text: &str) -> Result<String, &'static str> {
    match protocol::parse(text) {
        Ok(env) => Ok(format!("{:?}", env.request)
            .split(['(', ' ', '{'])
            .next()
            .unwrap_or_default()
            .to_owned()),
        Err(bad) => Err(bad.code),
    }
}
