//! Settings of the operator's process as a whole, made before its runtime starts.

/// Caps glibc's malloc at two arenas. glibc gives threads that allocate at the same time
/// arenas of their own (up to eight per core), and memory freed in one arena is not reused by
/// another: the operator's blocking threads (key generation, signing, reading certificates)
/// and runtime threads then hold freed memory apart. With 10,000 certificates the cap saved
/// about 15 MiB of resident memory (docs/benchmarks.md). Call it before any thread starts;
/// `MALLOC_ARENA_MAX`, if set, still wins. Elsewhere than glibc it does nothing.
pub fn cap_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; it is called before other threads
        // exist, and an unsupported value is refused (returns 0), not undefined.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}
