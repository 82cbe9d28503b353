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

/// How often [`return_free_memory`] gives free heap memory back.
const RETURN_FREE_MEMORY_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Gives the free memory inside malloc's heaps back to the system every 5 s, from a thread
/// of its own. glibc returns a heap's free memory only from its top: a long-running operator
/// replaces its cached objects version by version, and the holes the old versions leave stay
/// resident. Over a 1,000-Machine rollout at max-parallel 1 the operator held 25.6 MiB while
/// another 22.1 MiB sat free in its heaps (docs/benchmarks.md). `malloc_trim` releases those
/// pages (the memory stays mapped and is reused) in a few milliseconds. Elsewhere than glibc
/// it does nothing.
pub fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let trimming = std::thread::Builder::new()
            .name("malloc-trim".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(RETURN_FREE_MEMORY_EVERY);
                    // SAFETY: malloc_trim only releases free pages of malloc's heaps; it takes
                    // the allocator's own locks and is safe to call from any thread.
                    unsafe {
                        libc::malloc_trim(0);
                    }
                }
            });
        if let Err(e) = trimming {
            tracing::warn!(error = %e, "cannot start the thread that returns free memory; memory stays as malloc keeps it");
        }
    }
}
