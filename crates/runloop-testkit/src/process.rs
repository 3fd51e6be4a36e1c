//! What became of a process the test started, read from `/proc`.

/// Whether `/proc/<pid>` is gone: the process ended and was reaped.
pub fn reaped(pid: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
}
