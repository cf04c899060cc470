//! How the process gets memory for big allocations: straight from the kernel and back.
//!
//! An entry of 100 MB passes through a few buffers of its size. glibc's allocator serves
//! allocations that big with their own mappings, but raises that threshold each time one is
//! freed, so the next big buffers come from the heap, which keeps them once freed: one 100 MB
//! entry once left the host 374 MB resident for good. A fixed threshold keeps every big
//! buffer a mapping of its own, returned whole when freed.
//!
//! The `sluice` and `sluice-bench` binaries allocate with mimalloc (see `main.rs`), which maps
//! huge blocks on its own and gives them back after its purge delay; this setting is for a
//! program that embeds the library with glibc's allocator.

/// Allocations from this size on are mappings of their own.
pub const BIG_ALLOCATION: usize = 1 << 20;

/// Fix glibc's threshold at [`BIG_ALLOCATION`]. Call once, first thing in `main`.
pub fn give_back_big_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: mallopt only sets an allocator parameter; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, BIG_ALLOCATION as libc::c_int);
    }
}
