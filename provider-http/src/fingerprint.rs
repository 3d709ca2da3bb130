//! The SHA-256 fingerprint of a certificate, as vSphere and `openssl x509 -fingerprint` show it.

use std::fmt;
use std::str::FromStr;

use machine_core::{Error, ErrorKind};
use sha2::{Digest, Sha256};

/// The SHA-256 digest of a certificate's DER encoding.
///
/// Parsed from 64 hex digits, with or without `:` between the bytes, in either case
/// (`AB:CD:…` as vCenter and OpenSSL print it, or `abcd…`); shown as upper-case pairs
/// joined by `:`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CertFingerprint([u8; 32]);

impl CertFingerprint {
    /// The fingerprint of a certificate given in DER.
    pub fn of_der(der: &[u8]) -> Self {
        CertFingerprint(Sha256::digest(der).into())
    }

    /// The 32 bytes of the digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl FromStr for CertFingerprint {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let refuse = |why: &str| {
            Error::new(
                ErrorKind::InvalidSpec,
                format!(
                    "a SHA-256 certificate fingerprint must be 64 hex digits, or 32 pairs of them joined by ':'; {why}"
                ),
            )
        };
        let text = text.trim();
        // Exactly the two documented forms: 64 digits, or 32 pairs with one ':' between
        // each (a sign, a stray or doubled ':' is refused).
        let pairs: Vec<&str> = if text.contains(':') {
            text.split(':').collect()
        } else {
            (0..text.len())
                .step_by(2)
                .map(|i| text.get(i..i + 2).unwrap_or(""))
                .collect()
        };
        if pairs.len() != 32 || pairs.iter().any(|p| p.len() != 2) {
            return Err(refuse(&format!(
                "got {} characters in {} groups",
                text.chars().count(),
                pairs.len()
            )));
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(&pairs) {
            let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
            let [hi, lo] = pair.as_bytes() else {
                return Err(refuse("found a character that is not a hex digit"));
            };
            *byte = match (digit(*hi), digit(*lo)) {
                (Some(h), Some(l)) => h << 4 | l,
                _ => return Err(refuse(&format!("'{pair}' is not hex"))),
            };
        }
        Ok(CertFingerprint(bytes))
    }
}

impl fmt::Display for CertFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, byte) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{byte:02X}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for CertFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CertFingerprint({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn the_fingerprint_of_der_bytes_is_their_sha256() {
        assert_eq!(CertFingerprint::of_der(b""), EMPTY.parse().unwrap());
    }

    #[test]
    fn colons_and_either_case_parse_to_the_same_fingerprint() {
        let bare: CertFingerprint = EMPTY.parse().unwrap();
        let shown = bare.to_string();
        assert_eq!(shown.len(), 95);
        assert!(shown.starts_with("E3:B0:C4"));
        assert_eq!(shown.parse::<CertFingerprint>().unwrap(), bare);
        assert_eq!(
            shown.to_lowercase().parse::<CertFingerprint>().unwrap(),
            bare
        );
    }

    #[test]
    fn a_wrong_length_or_a_non_hex_digit_is_refused_saying_which() {
        let short = "ab:cd".parse::<CertFingerprint>().unwrap_err();
        assert_eq!(short.kind(), ErrorKind::InvalidSpec);
        assert!(
            short.message().contains("got 5 characters in 2 groups"),
            "{short}"
        );
        let mut bad = EMPTY.to_string();
        bad.replace_range(0..2, "zz");
        let err = bad.parse::<CertFingerprint>().unwrap_err();
        assert!(err.message().contains("'zz' is not hex"), "{err}");
        // The stray ':' of a mixed or broken form is named as a wrong grouping.
        let multibyte = format!("é{}", &EMPTY[2..]);
        assert!(multibyte.parse::<CertFingerprint>().is_err());
        // Only the documented forms: no sign, no stray or doubled colon, no mixed form.
        let signed = format!("+a{}", &EMPTY[2..]);
        assert!(
            signed.parse::<CertFingerprint>().is_err(),
            "a sign was accepted"
        );
        let stray = format!("{}:{}", &EMPTY[..3], &EMPTY[3..]);
        assert!(
            stray.parse::<CertFingerprint>().is_err(),
            "a stray colon was accepted"
        );
        let paired: Vec<String> = EMPTY
            .as_bytes()
            .chunks(2)
            .map(|c| String::from_utf8(c.to_vec()).unwrap())
            .collect();
        let doubled = paired.join("::");
        assert!(
            doubled.parse::<CertFingerprint>().is_err(),
            "doubled colons were accepted"
        );
        let half = format!("{}{}", paired[..16].join(":"), paired[16..].concat());
        assert!(
            half.parse::<CertFingerprint>().is_err(),
            "a mixed form was accepted"
        );
    }
}
