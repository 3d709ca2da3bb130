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
        let digits: String = text.trim().chars().filter(|c| *c != ':').collect();
        let refuse = |why: &str| {
            Error::new(
                ErrorKind::InvalidSpec,
                format!(
                    "a SHA-256 certificate fingerprint must be 64 hex digits, optionally in pairs joined by ':'; {why}"
                ),
            )
        };
        if digits.len() != 64 {
            return Err(refuse(&format!("got {} hex digits", digits.len())));
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            let pair = digits
                .get(2 * i..2 * i + 2)
                .ok_or_else(|| refuse("found a character that is not a hex digit"))?;
            *byte = u8::from_str_radix(pair, 16)
                .map_err(|_| refuse(&format!("'{pair}' is not hex")))?;
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
        assert!(short.message().contains("got 4 hex digits"), "{short}");
        let mut bad = EMPTY.to_string();
        bad.replace_range(0..2, "zz");
        let err = bad.parse::<CertFingerprint>().unwrap_err();
        assert!(err.message().contains("'zz' is not hex"), "{err}");
        let multibyte = format!("é{}", &EMPTY[2..]);
        assert!(multibyte.parse::<CertFingerprint>().is_err());
    }
}
