//! The processes a test starts: what became of one, read from `/proc`,
//! and a child killed when the test lets it go.

/// Whether `/proc/<pid>` is gone: the process ended and was reaped.
pub fn reaped(pid: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// A child process the test started, killed and reaped when the test lets
/// it go — at its end, or when an assertion fails first — so that nothing
/// a test started outlives it. It is the child otherwise (`Deref`).
#[derive(Debug)]
pub struct KillOnDrop(pub std::process::Child);

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;

    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
