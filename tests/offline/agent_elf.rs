//! The agent provision pushes, read from its ELF headers: an x86-64 executable that needs
//! nothing from the target (no `NEEDED` library, no program interpreter), so it runs on a
//! Debian 11 guest as on a Debian 13 one, and on a kernel of 3.10 or later (its ABI note).
//! It fails when the CLI carries no agent: scripts/build-agent builds it.

use object::elf;
use object::read::elf::{Dyn, FileHeader, ProgramHeader};
use provision::agent::client::AgentBinary;

/// The agent's bytes as they land on a target.
fn agent() -> Vec<u8> {
    let binary = AgentBinary::embedded()
        .expect("this provision carries no agent: run scripts/build-agent, then test again");
    binary.unpacked().unwrap()
}

/// What an executable asks of the system that loads it, from its program headers.
struct Needs {
    machine: u16,
    /// `PT_INTERP` segments (a dynamic loader to run it).
    interpreters: usize,
    /// `DT_NEEDED` entries (shared libraries).
    needed: usize,
    /// The GNU ABI note: OS and the oldest kernel (major, minor, patch).
    abi: Option<(u32, u32, u32, u32)>,
}

fn needs(data: &[u8]) -> Needs {
    let header = elf::FileHeader64::<object::Endianness>::parse(data).unwrap();
    let endian = header.endian().unwrap();
    let segments = header.program_headers(endian, data).unwrap();
    let mut n = Needs {
        machine: header.e_machine(endian),
        interpreters: 0,
        needed: 0,
        abi: None,
    };
    for p in segments {
        if p.p_type(endian) == elf::PT_INTERP {
            n.interpreters += 1;
        }
        if let Some(dynamic) = p.dynamic(endian, data).unwrap() {
            n.needed += dynamic
                .iter()
                .filter(|d| d.d_tag(endian) == elf::DT_NEEDED)
                .count();
        }
        if let Some(mut notes) = p.notes(endian, data).unwrap() {
            while let Some(note) = notes.next().unwrap() {
                if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_ABI_TAG {
                    let word = |i: usize| {
                        let b: [u8; 4] = note.desc()[i * 4..i * 4 + 4].try_into().unwrap();
                        endian_u32(endian, b)
                    };
                    n.abi = Some((word(0), word(1), word(2), word(3)));
                }
            }
        }
    }
    n
}

#[test]
fn the_pushed_agent_needs_no_library_and_no_newer_kernel_than_3_10() {
    let n = needs(&agent());
    assert_eq!(n.machine, elf::EM_X86_64);
    assert_eq!(
        n.interpreters, 0,
        "the agent names a program interpreter (ld.so)"
    );
    assert_eq!(
        n.needed, 0,
        "the agent has NEEDED entries (readelf -d shows them)"
    );
    let (os, major, minor, patch) = n.abi.expect("the agent has no GNU ABI note");
    assert_eq!(os, elf::ELF_NOTE_OS_LINUX);
    assert!(
        (major, minor, patch) <= (3, 10, 0),
        "the agent needs Linux {major}.{minor}.{patch}"
    );
}

/// The same reading of the CLI's own binary (what provision pushed before it carried an
/// agent) finds its loader and its libraries (libssl.so.3 among them): the check above
/// sees what it is there to refuse.
#[test]
fn the_cli_binary_itself_would_need_a_loader_and_libraries() {
    let n = needs(&std::fs::read(env!("CARGO_BIN_EXE_provision")).unwrap());
    assert_eq!(n.interpreters, 1);
    assert!(n.needed >= 2, "{} NEEDED entries", n.needed);
}

fn endian_u32(endian: object::Endianness, b: [u8; 4]) -> u32 {
    match endian {
        object::Endianness::Little => u32::from_le_bytes(b),
        object::Endianness::Big => u32::from_be_bytes(b),
    }
}

#[test]
fn the_agent_travels_compressed_and_unpacks_to_its_hash() {
    use sha2::{Digest, Sha256};
    let binary = AgentBinary::embedded().expect("run scripts/build-agent");
    let raw = binary.unpacked().unwrap();
    assert_eq!(hex::encode(Sha256::digest(&raw)), binary.sha256());
    let zstd = binary
        .packed(provision::agent::client::Wire::Zstd)
        .unwrap()
        .len();
    assert!(zstd < raw.len() / 2, "{zstd} of {}", raw.len());
    let gzip = binary
        .packed(provision::agent::client::Wire::Gzip)
        .unwrap()
        .to_vec();
    let mut unpacked = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gzip[..]), &mut unpacked)
        .unwrap();
    assert_eq!(unpacked, raw);
}

/// The agent links none of the CLI's crates: code linked in leaves its crate's source paths
/// (panic locations) in the binary, as the CLI's own binary shows for each of them.
#[test]
fn the_agent_links_no_cli_ssh_template_or_schema_crate() {
    let agent = agent();
    let cli = std::fs::read(env!("CARGO_BIN_EXE_provision")).unwrap();
    let has = |bytes: &[u8], word: &str| bytes.windows(word.len()).any(|w| w == word.as_bytes());
    for krate in ["/clap_builder-", "/ssh2-", "/handlebars-", "/schemars-"] {
        assert!(
            has(&cli, krate),
            "the CLI has no {krate}: the check reads nothing"
        );
        assert!(!has(&agent, krate), "the agent links {krate}");
    }
}
