//! User data and meta-data as cloud-init's VMware datasource reads them: extraConfig
//! `guestinfo.userdata` / `guestinfo.metadata`, each with a `.encoding` key
//! (`gzip+base64` or `base64`).

use std::io::{Read, Write};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use machine_core::{ContentEncoding, Error, MachineName, Result, UserData};

/// The user data key.
pub const USERDATA: &str = "guestinfo.userdata";
/// The user data's encoding key.
pub const USERDATA_ENCODING: &str = "guestinfo.userdata.encoding";
/// The meta-data key.
pub const METADATA: &str = "guestinfo.metadata";
/// The meta-data's encoding key.
pub const METADATA_ENCODING: &str = "guestinfo.metadata.encoding";

/// User data as a guestinfo value and its encoding: gzip-compressed unless that does
/// not make it smaller, then base64.
pub(crate) fn encode_user_data(ud: &UserData) -> (String, &'static str) {
    if ud.encoding == ContentEncoding::Gzip {
        return (STANDARD.encode(&ud.bytes), "gzip+base64");
    }
    encode(&ud.bytes)
}

/// Bytes as a guestinfo value, compressed when that helps.
pub(crate) fn encode(bytes: &[u8]) -> (String, &'static str) {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    // Writing into a Vec cannot fail.
    let zipped = gz.write_all(bytes).and_then(|()| gz.finish()).ok();
    match zipped {
        Some(z) if z.len() < bytes.len() => (STANDARD.encode(z), "gzip+base64"),
        _ => (STANDARD.encode(bytes), "base64"),
    }
}

/// The meta-data cloud-init's VMware datasource needs: instance id and hostname.
pub(crate) fn metadata(name: &MachineName, uuid_hint: &str) -> String {
    serde_json::json!({
        "instance-id": format!("{}-{uuid_hint}", name.as_str()),
        "local-hostname": name.as_str(),
    })
    .to_string()
}

/// The bytes of a guestinfo value written with `encoding` (gzip left compressed, so
/// that the caller sees what was delivered).
pub(crate) fn decode(value: &str, encoding: &str) -> Result<Vec<u8>> {
    let b64 = |v: &str| {
        STANDARD
            .decode(v.trim())
            .map_err(|e| Error::permanent(format!("{USERDATA} is not base64: {e}")))
    };
    match encoding.trim() {
        "" => Ok(value.as_bytes().to_vec()),
        "base64" | "b64" | "gzip+base64" | "gz+b64" => b64(value),
        other => Err(Error::permanent(format!(
            "{USERDATA_ENCODING} {other:?} is not one this provider reads"
        ))),
    }
}

/// gunzip, for tests and callers that want the plain text.
pub fn gunzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .map_err(|e| Error::permanent("guestinfo value is not valid gzip").with_source(e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use machine_core::UserDataFormat;

    use super::*;

    #[test]
    fn user_data_round_trips_both_ways() {
        let text = "#cloud-config\n".to_owned() + &"runcmd: [echo hi]\n".repeat(50);
        let (v, enc) = encode_user_data(&UserData::new(UserDataFormat::CloudConfig, text.clone()));
        assert_eq!(enc, "gzip+base64");
        assert_eq!(gunzip(&decode(&v, enc).unwrap()).unwrap(), text.as_bytes());
        let (v, enc) = encode(b"x");
        assert_eq!((enc, decode(&v, enc).unwrap()), ("base64", b"x".to_vec()));
        assert!(decode("!!", "base64").is_err());
        assert!(decode("x", "rot13").is_err());
    }
}
