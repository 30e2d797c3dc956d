//! The wgpu device the CubeCL tests run on, shared by every `*_wgpu` test and the
//! architecture suites' wgpu tests (`#[path = "common/wgpu.rs"] mod wgpu_probe;`).

use aphro_engine::backend::wgpu::{WgpuBackend, WgpuDevice};

/// The default wgpu device when a round trip through it works; otherwise `None` after
/// saying why. Under `CI=true` a missing adapter fails the test instead: CI installs
/// lavapipe, so a skip there would hide the GPU path.
pub fn device() -> Option<WgpuDevice> {
    let dev = WgpuDevice::default();
    let probe = dev.clone();
    let ok = std::panic::catch_unwind(move || {
        burn::tensor::Tensor::<WgpuBackend, 1>::ones([4], &probe)
            .into_data()
            .to_vec::<f32>()
            .map(|v| v == vec![1.0; 4])
    });
    match ok {
        Ok(Ok(true)) => Some(dev),
        other => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(
                !ci,
                "no working wgpu adapter under CI ({other:?}): install lavapipe \
                 (apt-get install mesa-vulkan-drivers libvulkan1)"
            );
            eprintln!("SKIPPED: no working wgpu/Vulkan adapter (install mesa-vulkan-drivers)");
            None
        }
    }
}
