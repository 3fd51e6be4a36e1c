//! Loop devices: a run's disk file attached as a block device by this
//! process, with the kernel's loop-control interface.
//!
//! What `mount -o loop` does, without running it: ask `/dev/loop-control`
//! for a free device, and configure it in one call (`LOOP_CONFIGURE`,
//! Linux 5.8; `LOOP_SET_FD` and `LOOP_SET_STATUS64` before it) with the
//! file and the auto-clear flag, so the device detaches by itself when the
//! file system on it is unmounted and its last holder closes it. Another
//! process may take the free device between the question and the call:
//! the call then fails with `EBUSY`, and the next free one is tried.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// `LOOP_CTL_GET_FREE`.
const CTL_GET_FREE: libc::c_ulong = 0x4C82;
/// `LOOP_CONFIGURE`.
const CONFIGURE: libc::c_ulong = 0x4C0A;
/// `LOOP_SET_FD`, `LOOP_SET_STATUS64`, `LOOP_CLR_FD`.
const SET_FD: libc::c_ulong = 0x4C00;
const SET_STATUS64: libc::c_ulong = 0x4C04;
const CLR_FD: libc::c_ulong = 0x4C01;
/// `LO_FLAGS_AUTOCLEAR`.
const AUTOCLEAR: u32 = 4;
/// Free devices tried before giving up (each taken by someone else first).
const TRIES: usize = 64;

/// `struct loop_info64`.
#[repr(C)]
struct Info {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    size_limit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
struct Config {
    fd: u32,
    block_size: u32,
    info: Info,
    reserved: [u64; 8],
}

/// A loop device this process attached, open: dropped before anything
/// else holds it, it detaches.
#[derive(Debug)]
pub struct Device {
    path: PathBuf,
    _device: File,
}

impl Device {
    /// `/dev/loopN`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Attaches `file` (read and written) to a free loop device, auto-clear.
pub fn attach(file: &Path) -> io::Result<Device> {
    let backing = File::options().read(true).write(true).open(file)?;
    let control = File::options()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let mut info = Info {
        device: 0,
        inode: 0,
        rdevice: 0,
        offset: 0,
        size_limit: 0,
        number: 0,
        encrypt_type: 0,
        encrypt_key_size: 0,
        flags: AUTOCLEAR,
        file_name: [0; 64],
        crypt_name: [0; 64],
        encrypt_key: [0; 32],
        init: [0; 2],
    };
    let name = file.as_os_str().as_encoded_bytes();
    let kept = name.len().min(63);
    info.file_name[..kept].copy_from_slice(&name[..kept]);
    let config = Config {
        fd: u32::try_from(backing.as_raw_fd()).map_err(io::Error::other)?,
        block_size: 0,
        info,
        reserved: [0; 8],
    };
    for _ in 0..TRIES {
        // SAFETY: an ioctl that takes no argument and returns a number.
        let number = unsafe { libc::ioctl(control.as_raw_fd(), CTL_GET_FREE) };
        if number < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{number}"));
        let device = File::options().read(true).write(true).open(&path)?;
        match configure(&device, &config) {
            Ok(()) => {
                return Ok(Device {
                    path,
                    _device: device,
                });
            }
            // Taken by someone else since: the next one.
            Err(error) if error.raw_os_error() == Some(libc::EBUSY) => continue,
            Err(error) => return Err(error),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("{TRIES} free loop devices in a row were taken by others first"),
    ))
}

/// Configures `device` with `config`: in one call where the kernel has
/// it, else in two.
fn configure(device: &File, config: &Config) -> io::Result<()> {
    let fd = device.as_raw_fd();
    // SAFETY: `config` is a `struct loop_config` that outlives the call.
    if unsafe { libc::ioctl(fd, CONFIGURE, config as *const Config) } == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if !matches!(error.raw_os_error(), Some(libc::EINVAL | libc::ENOTTY)) {
        return Err(error);
    }
    // Before Linux 5.8: the file, then its flags.
    // SAFETY: ioctls on integers and on a `struct loop_info64` that
    // outlives the call.
    unsafe {
        if libc::ioctl(fd, SET_FD, libc::c_ulong::from(config.fd)) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::ioctl(fd, SET_STATUS64, &config.info as *const Info) != 0 {
            let error = io::Error::last_os_error();
            libc::ioctl(fd, CLR_FD, 0);
            return Err(error);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_attached_and_its_device_clears_when_closed() {
        if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
            return;
        }
        let dir = tempfile::tempdir().expect("temp");
        let file = dir.path().join("disk.img");
        File::create(&file)
            .and_then(|f| f.set_len(1 << 20))
            .expect("a file");
        let device = attach(&file).expect("attached");
        assert_eq!(crate::disk::loop_devices(&file), [device.path().to_owned()]);
        let size = std::fs::read_to_string(format!(
            "/sys/block/{}/size",
            device
                .path()
                .file_name()
                .and_then(|n| n.to_str())
                .expect("a name")
        ))
        .expect("its size");
        assert_eq!(size.trim(), "2048", "1 MiB in 512-byte sectors");
        drop(device);
        // Auto-clear: the last close detaches it (the kernel may take a
        // moment).
        for _ in 0..200 {
            if crate::disk::loop_devices(&file).is_empty() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the loop device stayed attached");
    }
}
