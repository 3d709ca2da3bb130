//! The NoCloud seed: an ISO 9660 image labelled `cidata` holding `user-data`,
//! `meta-data` and optionally `network-config`, built in memory.
//!
//! Written here rather than with a crate: the one maintained pure-Rust ISO writer
//! (hadris-iso) is at a release candidate (3.0.0-rc.2) split over five crates, while a
//! seed needs one directory of three files: a primary volume descriptor with a Joliet
//! supplementary one (so Linux, xorriso and isoinfo see the exact lower-case names),
//! their path tables and root directories, and the file data. The output depends only
//! on the input (no timestamps), so the same seed is the same bytes.

use machine_core::{Error, Result};

/// ISO 9660's logical sector size.
const SECTOR: usize = 2048;
/// The volume label cloud-init's NoCloud datasource looks for.
pub const VOLUME_LABEL: &str = "cidata";
/// The largest file a seed takes: cloud-init reads user data into memory, and the BMC
/// downloads the whole image before booting.
pub const MAX_FILE_BYTES: usize = 16 * 1024 * 1024;

/// The files of a NoCloud seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed<'a> {
    /// `user-data`: the cloud-config (or MIME multipart) the composer rendered.
    pub user_data: &'a [u8],
    /// `meta-data`: at least `instance-id`.
    pub meta_data: &'a [u8],
    /// `network-config`, when the spec has one.
    pub network_config: Option<&'a [u8]>,
}

/// Sectors of the fixed layout: 16 system-area sectors, then descriptors, path tables
/// and the two root directories, then the files.
const PVD: usize = 16;
const SVD: usize = 17;
const TERMINATOR: usize = 18;
const PATH_L: usize = 19;
const PATH_M: usize = 20;
const JOLIET_PATH_L: usize = 21;
const JOLIET_PATH_M: usize = 22;
const ROOT: usize = 23;
const JOLIET_ROOT: usize = 24;
const FIRST_FILE: usize = 25;
/// One path-table entry for the root: 8 bytes, a one-byte id and a pad byte.
const PATH_TABLE_BYTES: usize = 10;

impl Seed<'_> {
    /// The ISO image. Fails as invalid spec on `userData` (or the file's name) when a
    /// file is over [`MAX_FILE_BYTES`].
    pub fn to_iso(&self) -> Result<Vec<u8>> {
        let mut files: Vec<(&str, &[u8])> =
            vec![("meta-data", self.meta_data), ("user-data", self.user_data)];
        if let Some(n) = self.network_config {
            files.push(("network-config", n));
        }
        // Directory records are sorted by identifier; these names already are.
        files.sort_by_key(|(name, _)| *name);
        for (name, data) in &files {
            if data.len() > MAX_FILE_BYTES {
                let field = if *name == "user-data" {
                    "userData"
                } else {
                    name
                };
                return Err(Error::invalid_spec(
                    field,
                    format!(
                        "{name} is {} bytes; a NoCloud seed takes at most {MAX_FILE_BYTES}",
                        data.len()
                    ),
                ));
            }
        }
        let mut extents = Vec::with_capacity(files.len());
        let mut next = FIRST_FILE;
        for (_, data) in &files {
            extents.push(next);
            next += data.len().div_ceil(SECTOR).max(1);
        }
        let total = next;
        let mut iso = vec![0u8; total * SECTOR];

        let primary: Vec<(Vec<u8>, usize, usize)> = files
            .iter()
            .zip(&extents)
            .map(|((name, data), &at)| (primary_name(name), at, data.len()))
            .collect();
        let joliet: Vec<(Vec<u8>, usize, usize)> = files
            .iter()
            .zip(&extents)
            .map(|((name, data), &at)| (ucs2(name), at, data.len()))
            .collect();

        descriptor(&mut iso[PVD * SECTOR..][..SECTOR], false, total);
        descriptor(&mut iso[SVD * SECTOR..][..SECTOR], true, total);
        let t = &mut iso[TERMINATOR * SECTOR..][..SECTOR];
        t[0] = 255;
        t[1..6].copy_from_slice(b"CD001");
        t[6] = 1;
        for (at, root, big_endian) in [
            (PATH_L, ROOT, false),
            (PATH_M, ROOT, true),
            (JOLIET_PATH_L, JOLIET_ROOT, false),
            (JOLIET_PATH_M, JOLIET_ROOT, true),
        ] {
            path_table(&mut iso[at * SECTOR..][..SECTOR], root, big_endian);
        }
        directory(&mut iso[ROOT * SECTOR..][..SECTOR], ROOT, &primary);
        directory(
            &mut iso[JOLIET_ROOT * SECTOR..][..SECTOR],
            JOLIET_ROOT,
            &joliet,
        );
        for ((_, data), &at) in files.iter().zip(&extents) {
            iso[at * SECTOR..][..data.len()].copy_from_slice(data);
        }
        Ok(iso)
    }
}

/// The primary tree's identifier: upper case with version `;1`, as ISO 9660 level 2
/// writes it (Linux shows it lower case without the version).
fn primary_name(name: &str) -> Vec<u8> {
    format!("{};1", name.to_ascii_uppercase()).into_bytes()
}

/// Joliet's identifiers and labels: UCS-2, big-endian.
fn ucs2(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_be_bytes).collect()
}

fn both_u16(buf: &mut [u8], v: u16) {
    buf[..2].copy_from_slice(&v.to_le_bytes());
    buf[2..4].copy_from_slice(&v.to_be_bytes());
}

fn both_u32(buf: &mut [u8], v: u32) {
    buf[..4].copy_from_slice(&v.to_le_bytes());
    buf[4..8].copy_from_slice(&v.to_be_bytes());
}

fn u32_of(v: usize) -> u32 {
    // The image is at most three files of MAX_FILE_BYTES: far below 4 GiB.
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// A text field: `text` then padding with spaces (UCS-2 spaces in Joliet).
fn text_field(buf: &mut [u8], text: &str, joliet: bool) {
    let bytes = if joliet {
        ucs2(text)
    } else {
        text.as_bytes().to_vec()
    };
    let space: &[u8] = if joliet { &[0, b' '] } else { b" " };
    for chunk in buf.chunks_mut(space.len()) {
        chunk.copy_from_slice(&space[..chunk.len()]);
    }
    let n = bytes.len().min(buf.len());
    buf[..n].copy_from_slice(&bytes[..n]);
}

/// The primary (or, with `joliet`, the Joliet supplementary) volume descriptor.
fn descriptor(d: &mut [u8], joliet: bool, total_sectors: usize) {
    d[0] = if joliet { 2 } else { 1 };
    d[1..6].copy_from_slice(b"CD001");
    d[6] = 1;
    text_field(&mut d[8..40], "", joliet);
    text_field(&mut d[40..72], VOLUME_LABEL, joliet);
    both_u32(&mut d[80..88], u32_of(total_sectors));
    if joliet {
        // UCS-2 level 3.
        d[88..91].copy_from_slice(b"%/E");
    }
    both_u16(&mut d[120..124], 1);
    both_u16(&mut d[124..128], 1);
    both_u16(&mut d[128..132], SECTOR as u16);
    both_u32(&mut d[132..140], PATH_TABLE_BYTES as u32);
    let (l, m, root) = if joliet {
        (JOLIET_PATH_L, JOLIET_PATH_M, JOLIET_ROOT)
    } else {
        (PATH_L, PATH_M, ROOT)
    };
    d[140..144].copy_from_slice(&u32_of(l).to_le_bytes());
    d[148..152].copy_from_slice(&u32_of(m).to_be_bytes());
    record(&mut d[156..190], root, SECTOR, true, &[0]);
    for range in [
        190..318,
        318..446,
        446..574,
        574..702,
        702..739,
        739..776,
        776..813,
    ] {
        text_field(&mut d[range], "", joliet);
    }
    // Dates "not specified": sixteen '0' digits and a zero offset.
    for at in [813, 830, 847, 864] {
        d[at..at + 16].fill(b'0');
    }
    d[881] = 1;
}

/// One path table of the one directory (the root) in either byte order.
fn path_table(t: &mut [u8], root: usize, big_endian: bool) {
    t[0] = 1;
    let extent = u32_of(root);
    t[2..6].copy_from_slice(&if big_endian {
        extent.to_be_bytes()
    } else {
        extent.to_le_bytes()
    });
    t[6..8].copy_from_slice(&if big_endian {
        1u16.to_be_bytes()
    } else {
        1u16.to_le_bytes()
    });
}

/// Writes one directory record at the start of `buf`; returns its length.
fn record(buf: &mut [u8], extent: usize, len: usize, dir: bool, id: &[u8]) -> usize {
    let size = 33 + id.len() + (id.len() + 1) % 2;
    buf[0] = size as u8;
    both_u32(&mut buf[2..10], u32_of(extent));
    both_u32(&mut buf[10..18], u32_of(len));
    // Recording date 18..25 left zero: not specified.
    buf[25] = if dir { 2 } else { 0 };
    both_u16(&mut buf[28..32], 1);
    buf[32] = id.len() as u8;
    buf[33..33 + id.len()].copy_from_slice(id);
    size
}

/// The root directory: `.`, `..` (the root again) and the files.
fn directory(sector: &mut [u8], own: usize, files: &[(Vec<u8>, usize, usize)]) {
    let mut at = record(sector, own, SECTOR, true, &[0]);
    at += record(&mut sector[at..], own, SECTOR, true, &[1]);
    for (id, extent, len) in files {
        at += record(&mut sector[at..], *extent, *len, false, id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_is_the_same_bytes_and_labelled_cidata() {
        let seed = Seed {
            user_data: b"#cloud-config\n",
            meta_data: b"instance-id: a\n",
            network_config: None,
        };
        let a = seed.to_iso().unwrap();
        assert_eq!(a, seed.to_iso().unwrap());
        assert_eq!(a.len() % SECTOR, 0);
        assert_eq!(&a[PVD * SECTOR + 1..PVD * SECTOR + 6], b"CD001");
        assert_eq!(&a[PVD * SECTOR + 40..PVD * SECTOR + 46], b"cidata");
    }

    #[test]
    fn user_data_over_the_limit_is_refused_naming_the_field() {
        let big = vec![b'x'; MAX_FILE_BYTES + 1];
        let e = Seed {
            user_data: &big,
            meta_data: b"",
            network_config: None,
        }
        .to_iso()
        .unwrap_err();
        assert_eq!(e.kind(), machine_core::ErrorKind::InvalidSpec);
        assert_eq!(e.field(), Some("userData"));
    }
}
