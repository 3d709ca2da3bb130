//! Reads user data into its parts as cloud-init would: a MIME multipart document is
//! split at its boundary and each part's transfer encoding undone; anything else is one
//! part. Only what the simulator needs to see what a real machine would run.

use base64::Engine;

/// The decoded parts of `user_data` (already decompressed).
pub(crate) fn parts(user_data: &[u8]) -> Vec<Vec<u8>> {
    let text = String::from_utf8_lossy(user_data);
    let Some(boundary) = boundary(&text) else {
        return vec![user_data.to_vec()];
    };
    let delimiter = format!("--{boundary}");
    text.split(delimiter.as_str())
        .skip(1)
        .take_while(|chunk| !chunk.starts_with("--"))
        .filter_map(decode_part)
        .collect()
}

/// The boundary of a top-level `multipart/*` content type.
fn boundary(text: &str) -> Option<String> {
    let head = text.split("\r\n\r\n").next()?.split("\n\n").next()?;
    let content_type = head.lines().find(|l| {
        l.to_ascii_lowercase()
            .starts_with("content-type: multipart/")
    })?;
    let (_, value) = content_type.split_once("boundary=")?;
    let value = value.split(';').next()?.trim();
    Some(value.trim_matches('"').to_owned())
}

/// One part's body with its `Content-Transfer-Encoding` undone.
fn decode_part(chunk: &str) -> Option<Vec<u8>> {
    let chunk = chunk.trim_start_matches(['\r', '\n']);
    let (headers, body) = chunk
        .split_once("\r\n\r\n")
        .or_else(|| chunk.split_once("\n\n"))?;
    let encoding = headers
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-transfer-encoding")
                .then(|| value.trim().to_ascii_lowercase())
        })
        .unwrap_or_default();
    let body = body.trim_end_matches(['\r', '\n']);
    match encoding.as_str() {
        "base64" => {
            let compact: String = body.split_whitespace().collect();
            base64::engine::general_purpose::STANDARD
                .decode(compact)
                .ok()
        }
        "quoted-printable" => {
            quoted_printable::decode(body, quoted_printable::ParseMode::Robust).ok()
        }
        _ => Some(body.as_bytes().to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::user_data::{self, UserDataFormat, UserDataPart};

    #[test]
    fn assembled_parts_read_back_whole_whatever_their_encoding() {
        let long_line = format!("#!/bin/sh\necho {}\n", "x".repeat(300));
        let given = vec![
            UserDataPart::new(UserDataFormat::CloudConfig, "a.yaml", "#cloud-config\n{}\n"),
            UserDataPart::new(UserDataFormat::ShellScript, "b.sh", long_line.clone()),
            UserDataPart::new(UserDataFormat::ShellScript, "c.sh", "#!/bin/sh\necho é\n"),
        ];
        let assembled = user_data::assemble(&given).unwrap().unwrap();
        let read = parts(&assembled.bytes);
        assert_eq!(read.len(), 3);
        assert!(String::from_utf8_lossy(&read[0]).starts_with("#cloud-config"));
        assert_eq!(read[1], long_line.as_bytes());
        assert_eq!(read[2], "#!/bin/sh\necho é\n".as_bytes());
    }
}
