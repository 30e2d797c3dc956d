//! Device selection (`--device`): which burn backend runs the model.
//!
//! `cpu` is `burn-flex`. `cuda` is `burn-cuda` (CubeCL), compiled in by the `cuda` cargo
//! feature; it needs no CUDA toolkit at build time because the driver (`libcuda.so.1`) and
//! the runtime compiler (`libnvrtc`) are loaded when the device is first used. Before that
//! happens, [`resolve`] dlopens both and initializes the device under `catch_unwind`, so a
//! machine without them gets a [`DeviceError`] naming what is missing instead of a panic.
//! `auto` (the default) is `cuda:0` when that succeeds and the CPU otherwise.

use std::fmt;
use std::str::FromStr;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The first CUDA GPU if this build has CUDA support and one is usable, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// CUDA GPU with this index.
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, DeviceError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|i| i.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| DeviceError::Unknown(s.to_string())),
        }
    }
}

/// `--device` as the serving flag takes it: one device for every engine, or one device per
/// data-parallel engine (`cuda:0,cuda:1`), as vLLM places one engine on each GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Devices(Vec<Device>);

impl Default for Devices {
    fn default() -> Self {
        Devices(vec![Device::Auto])
    }
}

impl From<Device> for Devices {
    fn from(d: Device) -> Self {
        Devices(vec![d])
    }
}

impl fmt::Display for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl FromStr for Devices {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, DeviceError> {
        let list = s
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<Device>, _>>()?;
        if list.len() > 1 {
            // Each engine owns its device: `auto` could land two engines on one GPU, and a
            // device named twice would do so outright.
            if list.contains(&Device::Auto) {
                return Err(DeviceError::List(format!(
                    "{s:?}: a list of devices names each one (cpu or cuda:N), not auto"
                )));
            }
            for (i, d) in list.iter().enumerate() {
                if list[..i].contains(d) {
                    return Err(DeviceError::List(format!("{s:?}: {d} is named twice")));
                }
            }
        }
        Ok(Devices(list))
    }
}

impl Devices {
    pub fn as_slice(&self) -> &[Device] {
        &self.0
    }

    /// How many engines to run and where: a list of N devices runs N engines, one on each
    /// (with `--data-parallel-size` left at 1 or set to N); one device runs all
    /// `data_parallel_size` engines (on the CPU each gets its share of the cores).
    pub fn per_engine(&self, data_parallel_size: usize) -> Result<Vec<Device>, DeviceError> {
        match (self.0.as_slice(), data_parallel_size) {
            ([d], n) => Ok(vec![*d; n]),
            (list, 1) => Ok(list.to_vec()),
            (list, n) if list.len() == n => Ok(list.to_vec()),
            (list, n) => Err(DeviceError::List(format!(
                "--device names {} devices but --data-parallel-size is {n}: give one device per \
                 engine",
                list.len()
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("unknown device {0:?} (expected auto, cpu, cuda or cuda:N)")]
    Unknown(String),
    /// A `--device` list that cannot place the engines.
    #[error("{0}")]
    List(String),
    #[error(
        "this build has no CUDA support: rebuild with `cargo build --release --features cuda` \
         (or use --device cpu)"
    )]
    CudaNotCompiled,
    #[error(
        "the NVIDIA driver library could not be loaded (tried {tried}): {reason}. \
         Install the NVIDIA driver, or use --device cpu"
    )]
    DriverMissing { tried: String, reason: String },
    #[error(
        "NVRTC, the CUDA runtime compiler, could not be loaded (tried {tried}): {reason}. \
         Install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc-cu12` and add its \
         `nvidia/cuda_nvrtc/lib` directory to LD_LIBRARY_PATH"
    )]
    NvrtcMissing { tried: String, reason: String },
    #[error("CUDA device {index} could not be initialized: {reason}")]
    Init { index: usize, reason: String },
}

/// Whether this build has the `cuda` feature.
pub const fn cuda_compiled() -> bool {
    cfg!(feature = "cuda")
}

/// Library names tried for the driver and for NVRTC, in order.
pub fn cuda_library_candidates() -> (&'static [&'static str], &'static [&'static str]) {
    if cfg!(windows) {
        (
            &["nvcuda.dll"],
            &[
                "nvrtc64_130_0.dll",
                "nvrtc64_120_0.dll",
                "nvrtc64_112_0.dll",
            ],
        )
    } else {
        (
            &["libcuda.so.1", "libcuda.so"],
            &[
                "libnvrtc.so",
                "libnvrtc.so.13",
                "libnvrtc.so.12",
                "libnvrtc.so.11.2",
                "libnvrtc.so.11",
            ],
        )
    }
}

/// Resolve `auto` and check that a CUDA device is usable before anything touches it.
pub fn resolve(device: Device) -> Result<Device, DeviceError> {
    match device {
        Device::Cpu => Ok(Device::Cpu),
        Device::Auto if !cuda_compiled() => Ok(Device::Cpu),
        Device::Auto => Ok(check_cuda(0)
            .map(|_| Device::Cuda(0))
            .unwrap_or(Device::Cpu)),
        Device::Cuda(i) => check_cuda(i).map(|_| Device::Cuda(i)),
    }
}

#[cfg(not(feature = "cuda"))]
fn check_cuda(_index: usize) -> Result<(), DeviceError> {
    Err(DeviceError::CudaNotCompiled)
}

#[cfg(feature = "cuda")]
fn check_cuda(index: usize) -> Result<(), DeviceError> {
    probe_cuda_libraries()?;
    cuda::init(index)
}

/// dlopen the driver and NVRTC (what burn-cuda loads lazily, and panics without).
#[cfg(feature = "cuda")]
pub fn probe_cuda_libraries() -> Result<(), DeviceError> {
    let (driver, nvrtc) = cuda_library_candidates();
    try_load(driver).map_err(|reason| DeviceError::DriverMissing {
        tried: driver.join(", "),
        reason,
    })?;
    try_load(nvrtc).map_err(|reason| DeviceError::NvrtcMissing {
        tried: nvrtc.join(", "),
        reason,
    })
}

#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
fn try_load(names: &[&str]) -> Result<(), String> {
    let mut last = String::from("not found");
    for name in names {
        // SAFETY: loading a vendor library runs its initializers; these are the libraries
        // the CUDA backend itself loads, and the handle is dropped at once.
        match unsafe { libloading::Library::new(name) } {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

#[cfg(feature = "cuda")]
pub mod cuda {
    //! The CUDA backend type and its device.
    use super::DeviceError;
    use burn::tensor::Tensor;

    /// `burn-cuda` without fusion: the engine's kernels work on plain CubeCL tensors.
    pub type CudaBackend = burn_cuda::Cuda<f32, i32>;
    pub use burn_cuda::CudaDevice;

    pub fn device(index: usize) -> CudaDevice {
        CudaDevice { index }
    }

    /// Create the device's context and run one tiny kernel; CubeCL panics on a missing or
    /// broken device, so this is the last line of defence.
    pub fn init(index: usize) -> Result<(), DeviceError> {
        let dev = device(index);
        std::panic::catch_unwind(move || {
            let t = Tensor::<CudaBackend, 1>::ones([4], &dev).mul_scalar(2.0);
            t.into_data().to_vec::<f32>().map(|v| v == vec![2.0; 4])
        })
        .map_err(|p| DeviceError::Init {
            index,
            reason: panic_text(p.as_ref()),
        })?
        .map_err(|e| DeviceError::Init {
            index,
            reason: format!("{e:?}"),
        })?
        .then_some(())
        .ok_or_else(|| DeviceError::Init {
            index,
            reason: "a test kernel computed a wrong result".into(),
        })
    }

    fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the CUDA runtime panicked".into())
    }
}

#[cfg(feature = "wgpu")]
pub mod wgpu {
    //! The wgpu backend type (Vulkan/Metal/DX12; the kernel tests run it on lavapipe).
    /// `burn-wgpu` without fusion, like [`super::Device::Cuda`]'s backend.
    pub type WgpuBackend = burn_wgpu::Wgpu<f32, i32, u32>;
    pub use burn_wgpu::WgpuDevice;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print() {
        for (s, d) in [
            ("auto", Device::Auto),
            ("cpu", Device::Cpu),
            ("CUDA", Device::Cuda(0)),
            ("cuda:3", Device::Cuda(3)),
        ] {
            assert_eq!(s.parse::<Device>(), Ok(d));
        }
        assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
        assert!(matches!(
            "tpu".parse::<Device>(),
            Err(DeviceError::Unknown(_))
        ));
        assert!("cuda:x".parse::<Device>().is_err());
    }

    #[test]
    fn device_lists_place_one_engine_per_device() {
        let two: Devices = "cuda:0,cuda:1".parse().expect("a device list");
        assert_eq!(two.to_string(), "cuda:0,cuda:1");
        assert_eq!(
            two.per_engine(1).expect("placed"),
            vec![Device::Cuda(0), Device::Cuda(1)]
        );
        assert_eq!(two.per_engine(2).expect("placed").len(), 2);
        let err = two.per_engine(3).expect_err("refused").to_string();
        assert!(
            err.contains("names 2 devices") && err.contains("is 3"),
            "{err}"
        );
        let one: Devices = "cpu".parse().expect("a device list");
        assert_eq!(one.per_engine(3).expect("placed"), vec![Device::Cpu; 3]);
        assert_eq!(
            Devices::default().per_engine(1).expect("placed"),
            vec![Device::Auto]
        );
        assert!("cpu,cuda:1".parse::<Devices>().is_ok());
        for bad in ["cuda:0,cuda:0", "auto,cuda:1", "cuda:0,", "cuda:0,tpu"] {
            assert!(bad.parse::<Devices>().is_err(), "{bad}");
        }
    }

    #[test]
    fn cpu_and_auto_resolve_without_cuda() {
        assert_eq!(resolve(Device::Cpu), Ok(Device::Cpu));
        if !cuda_compiled() {
            assert_eq!(resolve(Device::Auto), Ok(Device::Cpu));
            assert_eq!(resolve(Device::Cuda(0)), Err(DeviceError::CudaNotCompiled));
        }
    }
}
