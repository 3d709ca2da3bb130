//! gzip for user data, at a level chosen by measurement: on a 29 KiB three-layer
//! cloud-config, zlib-rs level 2 came within 1.4 % of `gzip -9`'s size at about three
//! times the speed of level 9 (level 1 was 27 % larger). The figures are in
//! BENCHMARKS.md under bootstrap-cloudinit.

use std::io::Write;

/// The deflate level used.
pub const GZIP_LEVEL: u32 = 2;

/// gzip-compresses `bytes` at [`GZIP_LEVEL`]; cloud-init unpacks it by its magic bytes.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 3 + 64),
        flate2::Compression::new(GZIP_LEVEL),
    );
    // Writing into a Vec cannot fail.
    enc.write_all(bytes).expect("write to Vec");
    enc.finish().expect("write to Vec")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_gunzip() {
        let text = "#cloud-config\nruncmd:\n".to_owned() + &"- echo hello\n".repeat(500);
        let gz = gzip(text.as_bytes());
        assert!(gz.len() < text.len() / 10);
        let mut out = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut out)
            .unwrap();
        assert_eq!(out, text);
    }
}
