//! SSH host keys from a machine's console: cloud-init's `keys-to-console` module prints
//! the host's public keys between `-----BEGIN SSH HOST KEY KEYS-----` and
//! `-----END SSH HOST KEY KEYS-----`. EC2 returns that console through
//! GetConsoleOutput, an out-of-band channel the machine cannot forge after the fact, so
//! keys read there let a transport pin the host instead of trusting on first use.

use base64::Engine;

const BEGIN: &str = "-----BEGIN SSH HOST KEY KEYS-----";
const END: &str = "-----END SSH HOST KEY KEYS-----";

/// Key algorithms cloud-init prints; anything else on a line is ignored.
const ALGORITHMS: [&str; 7] = [
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// The host keys in `console`, as `algorithm base64` lines without comments, from the
/// last complete key block (a rebooted machine prints one per boot). Lines may carry
/// prefixes (syslog headers, `ec2:`, timestamps) before the key. A key whose base64
/// does not decode, or whose encoded algorithm name differs from the one printed, is
/// skipped. Empty when there is no complete block.
pub fn parse_host_keys(console: &str) -> Vec<String> {
    let mut last: Option<Vec<String>> = None;
    let mut current: Option<Vec<String>> = None;
    for line in console.lines() {
        if line.contains(BEGIN) {
            current = Some(Vec::new());
        } else if line.contains(END) {
            if let Some(keys) = current.take() {
                last = Some(keys);
            }
        } else if let Some(keys) = current.as_mut()
            && let Some(key) = key_in_line(line)
            && !keys.contains(&key)
        {
            keys.push(key);
        }
    }
    last.unwrap_or_default()
}

fn key_in_line(line: &str) -> Option<String> {
    let mut words = line.split_whitespace();
    while let Some(word) = words.next() {
        if ALGORITHMS.contains(&word) {
            let blob = words.next()?;
            return valid_blob(word, blob).then(|| format!("{word} {blob}"));
        }
    }
    None
}

/// An OpenSSH public key blob starts with its algorithm name as an SSH string.
fn valid_blob(algorithm: &str, blob: &str) -> bool {
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(blob) else {
        return false;
    };
    let Some(len) = bytes.get(..4) else {
        return false;
    };
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    bytes.get(4..4 + len) == Some(algorithm.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(algorithm: &str) -> String {
        let mut b = (algorithm.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(algorithm.as_bytes());
        b.extend_from_slice(&[7u8; 32]);
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    #[test]
    fn keys_are_read_from_a_cloud_init_console() {
        let ed = blob("ssh-ed25519");
        let ec = blob("ecdsa-sha2-nistp256");
        let console = format!(
            "[    5.1] cloud-init[612]: Cloud-init v. 22.4.2 running 'modules:final'\n\
             <14>Dec  2 15:00:00 cloud-init: #####################\n\
             <14>Dec  2 15:00:00 cloud-init: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n\
             <14>Dec  2 15:00:00 cloud-init: 256 SHA256:9bq root@ip-10-0-0-5 (ED25519)\n\
             <14>Dec  2 15:00:00 cloud-init: -----END SSH HOST KEY FINGERPRINTS-----\n\
             -----BEGIN SSH HOST KEY KEYS-----\n\
             ecdsa-sha2-nistp256 {ec} root@ip-10-0-0-5\n\
             ec2: ssh-ed25519 {ed} root@ip-10-0-0-5\n\
             -----END SSH HOST KEY KEYS-----\n\
             Cloud-init v. 22.4.2 finished\n"
        );
        assert_eq!(
            parse_host_keys(&console),
            [
                format!("ecdsa-sha2-nistp256 {ec}"),
                format!("ssh-ed25519 {ed}")
            ]
        );
    }

    #[test]
    fn the_last_complete_block_wins_and_bad_keys_are_skipped() {
        let old = blob("ssh-ed25519");
        let new = {
            let mut b = 11u32.to_be_bytes().to_vec();
            b.extend_from_slice(b"ssh-ed25519");
            b.extend_from_slice(&[9u8; 32]);
            base64::engine::general_purpose::STANDARD.encode(b)
        };
        let mislabelled = blob("ssh-rsa");
        let console = format!(
            "{BEGIN}\nssh-ed25519 {old} a\n{END}\nreboot\n{BEGIN}\nssh-ed25519 {new} a\n\
             ssh-ed25519 {mislabelled} b\nssh-ed25519 not-base64! c\n{END}\n{BEGIN}\nssh-ed25519 {old} cut off"
        );
        assert_eq!(parse_host_keys(&console), [format!("ssh-ed25519 {new}")]);
    }

    #[test]
    fn consoles_without_keys_give_none() {
        assert!(parse_host_keys("").is_empty());
        assert!(
            parse_host_keys("Linux version 2.6.16-xenU\nBIOS-provided physical RAM map:\n")
                .is_empty()
        );
        assert!(
            parse_host_keys(&format!("{BEGIN}\nssh-ed25519 {}\n", blob("ssh-ed25519"))).is_empty()
        );
    }
}
