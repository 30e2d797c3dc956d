//! Whisper on the CubeCL path (burn-wgpu; in CI on Mesa's lavapipe, a CPU Vulkan driver):
//! tiny.en loaded with `Transcriber::load_on::<WgpuBackend>`, the encoder, the decoder's
//! device-side caches and the logits computed by CubeCL kernels, the timestamp rules and
//! segmenting on the host; two transcriptions at once share batched steps. Clips chosen to cover speech, silence and two 30 s windows
//! (seeking by the last timestamp) must equal faster-whisper's references, as on the CPU.
//!
//! Without a Vulkan adapter the test prints why and passes, except under `CI=true`, where a
//! missing adapter fails it (CI installs lavapipe: `mesa-vulkan-drivers`).

use aphro_engine::backend::wgpu::WgpuBackend;
use aphro_engine::speech::{TranscribeOptions, Transcriber, TranscriberConfig};

#[path = "common/wgpu.rs"]
mod wgpu_probe;
use wgpu_probe::device;

#[path = "common/whisper.rs"]
mod whisper;
use whisper::*;

#[test]
fn tiny_en_on_wgpu_equals_faster_whisper() {
    let Some(dev) = device() else { return };
    let t = Transcriber::load_on::<WgpuBackend>(&model_dir(), TranscriberConfig::default(), &dev)
        .expect("tiny.en loads on wgpu");
    let wanted = [
        "a01_hello_us",
        "a08_silence",
        "a09_long_chunking",
        "a10_yes",
    ];
    let cases: Vec<_> = wav_cases()
        .into_iter()
        .filter(|c| wanted.contains(&c["id"].as_str().expect("test data")))
        .collect();
    assert_eq!(cases.len(), wanted.len(), "fixture clips");
    // Two at a time, so batched steps (`step_batch`) run on the device too.
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let id = case["id"].as_str().expect("test data");
                let samples = read_wav(&testdata(case["file"].as_str().expect("test data")));
                let started = std::time::Instant::now();
                let got = t
                    .transcribe(&samples, &TranscribeOptions::default())
                    .expect("transcribe");
                eprintln!(
                    "{id}: {:.2} s of audio in {:.2?}",
                    got.duration,
                    started.elapsed()
                );
                check_reference(id, &got, &case["reference"]);
            });
        }
    });
    let stats = t.batch_stats();
    eprintln!("{stats:?}");
    assert!(
        stats.largest == 2 && stats.tokens > stats.steps,
        "{stats:?}"
    );
}
