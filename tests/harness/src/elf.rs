//! What the image and arm64 suites read from a binary's ELF header: which architecture it was
//! built for, and whether it asks for a dynamic loader. 64-bit little-endian ELF only, the kind
//! both targets produce.

/// `e_machine` of x86_64.
pub const EM_X86_64: u16 = 62;
/// `e_machine` of AArch64.
pub const EM_AARCH64: u16 = 183;

/// Whether `bytes` start as a 64-bit little-endian ELF file.
fn is_elf64_le(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x7fELF") && bytes.get(4) == Some(&2) && bytes.get(5) == Some(&1)
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// The architecture an ELF file was built for (`e_machine`), or None when `bytes` is not a
/// 64-bit little-endian ELF file.
pub fn machine(bytes: &[u8]) -> Option<u16> {
    is_elf64_le(bytes).then(|| u16_at(bytes, 0x12)).flatten()
}

/// Whether an ELF file asks for a dynamic loader (a PT_INTERP program header); None when
/// `bytes` is not a 64-bit little-endian ELF file or its program headers are cut short.
pub fn has_interpreter(bytes: &[u8]) -> Option<bool> {
    if !is_elf64_le(bytes) {
        return None;
    }
    let phoff = usize::try_from(u64_at(bytes, 0x20)?).ok()?;
    let (phentsize, phnum) = (usize::from(u16_at(bytes, 0x36)?), usize::from(u16_at(bytes, 0x38)?));
    let mut found = false;
    for i in 0..phnum {
        const PT_INTERP: u32 = 3;
        let at = phoff + i * phentsize;
        let kind = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?);
        found |= kind == PT_INTERP;
    }
    Some(found)
}
