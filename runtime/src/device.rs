//! Devices: where kernels run and buffers live.

use std::fmt;

use crate::Error;

/// The kind of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The host CPU, running kernels with the reference interpreter (program instances
    /// in parallel on a thread pool).
    Cpu,
}

/// A device kernels are launched on. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    kind: DeviceKind,
}

impl Device {
    /// The CPU device (always available).
    pub fn cpu() -> Device {
        Device {
            kind: DeviceKind::Cpu,
        }
    }

    /// The device named by `TESSERA_DEVICE` if set, else the best one present: CUDA,
    /// then HIP, then the CPU. (This build has the CPU device only.)
    pub fn best() -> Result<Device, Error> {
        match std::env::var("TESSERA_DEVICE") {
            Ok(name) if !name.trim().is_empty() => Device::by_name(name.trim()),
            _ => Ok(Device::cpu()),
        }
    }

    /// The device called `name`: `cpu`, `emu-nv`, `emu-amd`, `cuda` or `hip`
    /// (optionally `cuda:N`/`hip:N`).
    pub fn by_name(name: &str) -> Result<Device, Error> {
        let base = name.split(':').next().unwrap_or(name);
        match base {
            "cpu" => Ok(Device::cpu()),
            "emu-nv" | "emu-amd" => Err(Error::DeviceUnavailable {
                device: name.to_string(),
                reason: "the SIMT emulator is not part of this build yet".into(),
            }),
            "cuda" | "hip" => Err(Error::DeviceUnavailable {
                device: name.to_string(),
                reason: "GPU backends are not part of this build yet".into(),
            }),
            _ => Err(Error::UnknownDevice(name.to_string())),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> DeviceKind {
        self.kind
    }

    /// A short description, e.g. `cpu (interpreter, 2 threads)`.
    pub fn name(&self) -> String {
        match self.kind {
            DeviceKind::Cpu => format!(
                "cpu (reference interpreter, {} threads)",
                rayon::current_num_threads()
            ),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
