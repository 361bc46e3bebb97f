//! Intel AMX (Advanced Matrix Extensions) on this machine: whether the CPU
//! has the int8 tile multiply and the kernel lets this process use it.
//!
//! AMX's tile data is an extended register state that Linux (5.16 and
//! later) gives a process only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`); without it the first tile instruction faults. The
//! request is made once per process, here, when texc asks whether the CPU
//! has AMX; kernels compiled ahead of time make it again themselves (the
//! code generator's guarded `syscall`), so that they run in processes that
//! never asked.
//!
//! Invariants: [`amx_int8`] is true only if CPUID reports AMX-TILE and
//! AMX-INT8, the OS enables the tile state in XCR0, and the permission was
//! granted; it asks the OS at most once per process.

use std::sync::OnceLock;

/// `arch_prctl` code requesting an extended state component's permission.
pub const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
/// The extended state component of the tile data (XTILEDATA).
pub const XFEATURE_XTILEDATA: u64 = 18;

/// Whether this process can run AMX-INT8 tile instructions.
pub fn amx_int8() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| cpu_reports_amx_int8() && request_tile_permission())
}

#[cfg(target_arch = "x86_64")]
fn cpu_reports_amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let max_leaf = __cpuid(0).eax;
    if max_leaf < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    let (tile, int8) = (edx & (1 << 24) != 0, edx & (1 << 25) != 0);
    let osxsave = __cpuid(1).ecx & (1 << 27) != 0;
    if !(tile && int8 && osxsave) {
        return false;
    }
    // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS manages the tile state.
    let xcr0 = xgetbv0();
    xcr0 & (0b11 << 17) == 0b11 << 17
}

#[cfg(target_arch = "x86_64")]
fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: CPUID.1:ECX.OSXSAVE (checked by the caller) says XGETBV exists.
    unsafe { std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack)) };
    (u64::from(hi) << 32) | u64::from(lo)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_permission() -> bool {
    // SAFETY: arch_prctl with these arguments only changes this process's
    // permitted extended state; it reads and writes no memory of ours.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_permission() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_reports_amx_int8() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn request_tile_permission() -> bool {
    false
}

#[cfg(test)]
mod tests {
    /// Where the answer is yes, an instruction touching tile data runs
    /// (`tilezero`), which a process without the tile state dies of (SIGILL).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn a_yes_means_tile_instructions_run() {
        if !super::amx_int8() {
            eprintln!("skipped: this CPU (or its OS) gives no AMX-INT8 tiles");
            return;
        }
        // Palette 1, tile 0 of 16 rows of 64 bytes.
        let mut cfg = [0u8; 64];
        (cfg[0], cfg[16], cfg[48]) = (1, 64, 16);
        // SAFETY: the configuration is 64 readable bytes; the instructions
        // touch tile registers only, and AMX is there and permitted.
        unsafe {
            std::arch::asm!("ldtilecfg [{0}]", "tilezero tmm0", "tilerelease", in(reg) cfg.as_ptr(), options(nostack))
        };
    }
}
