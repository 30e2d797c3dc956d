//! Image render throughput on one thread: a `data:` URL JPEG through the whole multimodal
//! path (base64 decode, JPEG decode, Qwen2-VL resize + patchify, mm_hash, kwargs_data /
//! mm_metadata msgpack + base64), for a 640×480 and a 1920×1080 photo-like JPEG.
use aphro_core::multimodal::{
    decode_data_url, features_json, kwargs::to_base64, ImageInput, MultimodalOptions, Placeholder,
    VisionModel,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;

/// The allocator the `aphro` server runs with: each render allocates and frees tens of
/// megabytes, and what that costs in page faults depends on the allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A 1920×1080 JPEG (quality 90) with smooth gradients and fine texture, like a photo.
fn synthetic_jpeg(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let t = ((x * 7 + y * 13) % 31) as u8;
        image::Rgb([
            (x * 255 / w) as u8 ^ t,
            (y * 255 / h) as u8,
            ((x + y) % 256) as u8,
        ])
    });
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
        .encode_image(&img)
        .expect("encode jpeg");
    out
}

fn bench(c: &mut Criterion) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/multimodal");
    let vision = VisionModel::from_model_dir(
        &root.join("models/Qwen2-VL-2B-Instruct"),
        "Qwen/Qwen2-VL-2B-Instruct",
    )
    .expect("configs")
    .expect("vision");
    let scene = std::fs::read(root.join("images/scene_640x480.jpg")).expect("scene");
    let cases = [
        ("jpeg_640x480", scene),
        ("jpeg_1920x1080", synthetic_jpeg(1920, 1080)),
    ];
    let mut group = c.benchmark_group("multimodal_render");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    for (name, bytes) in cases {
        let url = format!("data:image/jpeg;base64,{}", to_base64(&bytes));
        group.bench_function(name, |b| {
            b.iter(|| {
                let file = decode_data_url(&url).expect("data url");
                let images = [ImageInput {
                    file: Some(file),
                    uuid: None,
                }];
                let feats = vision
                    .process_images(&images, None, MultimodalOptions::default())
                    .expect("process");
                let runs = [Placeholder {
                    offset: 15,
                    length: feats[0].processed.num_tokens,
                }];
                let v = features_json(&feats, &runs, true);
                assert!(v["kwargs_data"] != json!(null));
                v
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
