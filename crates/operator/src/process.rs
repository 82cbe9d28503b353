//! Settings of the operator's process as a whole, made before its runtime starts.

/// Caps glibc's malloc at two arenas. glibc gives threads that allocate at the same time
/// arenas of their own (up to eight per core), and memory freed in one arena is not reused by
/// another: the operator's blocking threads (key generation, signing, reading certificates)
/// and runtime threads then hold freed memory apart. With 10,000 certificates the cap saved
/// about 15 MiB of resident memory (docs/benchmarks.md).
///
/// Also keeps large blocks (128 KiB and more: pages of a watch's list, JSON bodies) in memory
/// maps of their own, returned when freed. glibc otherwise raises that threshold each time
/// such a block is freed, after which large blocks come from the heap and leave holes in it
/// that small objects fill: about 4 MiB more at the peak of a 10,000-certificate rotation.
///
/// Call it before any thread starts; `MALLOC_ARENA_MAX` and `MALLOC_MMAP_THRESHOLD_`, if set,
/// still win. Elsewhere than glibc it does nothing.
pub fn cap_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets an allocator parameter; it is called before other threads
        // exist, and an unsupported value is refused (returns 0), not undefined.
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, 2);
            }
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
            }
        }
    }
}
