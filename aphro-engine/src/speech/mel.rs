//! Whisper's log-mel front end, computed as openai-whisper's `log_mel_spectrogram` does:
//! periodic Hann window (400), `torch.stft` centre padding of 200 samples on each side in
//! reflect mode, the 201-bin power spectrum `|X|²` of every 160-sample hop with the last
//! frame dropped, the mel filter bank, `log10(max(x, 1e-10))`, a floor at `max − 8` over
//! the whole matrix, and `(x + 4) / 4`.
//!
//! The filter bank is openai-whisper's own `mel_80` matrix [80, 201]
//! (`mel_filters_80x201.f32le`, little-endian f32, row-major), taken from
//! `whisper/assets/mel_filters.npz` in the PyPI sdist `openai-whisper==20250625` (MIT
//! licence; npz sha256 7450ae70723a5ef9d341e3cee628c7cb0177f36ce42c44b7ed2bf3325f0f6d4c).
//!
//! The FFT and the filter bank run in `f64` (as the reference goldens are computed); the
//! result is `f32`.

use std::sync::Arc;

use realfft::{RealFftPlanner, RealToComplex};

pub const SAMPLE_RATE: usize = 16_000;
pub const N_FFT: usize = 400;
pub const HOP_LENGTH: usize = 160;
const N_BINS: usize = N_FFT / 2 + 1;
/// Frames in one 30 s window.
pub const N_FRAMES: usize = 3000;
/// Samples in one 30 s window.
pub const N_SAMPLES: usize = N_FRAMES * HOP_LENGTH;

static MEL_80: &[u8] = include_bytes!("mel_filters_80x201.f32le");

/// A log-mel spectrogram: `n_mels` rows of `n_frames` values (mel-major, as Whisper's
/// encoder reads it).
#[derive(Debug, Clone, PartialEq)]
pub struct LogMel {
    pub n_mels: usize,
    pub n_frames: usize,
    pub data: Vec<f32>,
}

impl LogMel {
    /// Value of mel bin `m` at frame `t`.
    pub fn at(&self, m: usize, t: usize) -> f32 {
        self.data[m * self.n_frames + t]
    }

    /// Frames `[start, start + N_FRAMES)` as one encoder input `[n_mels, N_FRAMES]`, the
    /// frames past the end (or past `start + len`) zero: faster-whisper's `pad_or_trim` in
    /// the feature domain.
    pub fn window_into(&self, start: usize, len: usize, out: &mut Vec<f32>) {
        out.clear();
        out.resize(self.n_mels * N_FRAMES, 0.0);
        let end = (start + len.min(N_FRAMES)).min(self.n_frames);
        if start >= end {
            return;
        }
        for m in 0..self.n_mels {
            let src = &self.data[m * self.n_frames + start..m * self.n_frames + end];
            out[m * N_FRAMES..m * N_FRAMES + src.len()].copy_from_slice(src);
        }
    }
}

/// The front end: the filter bank (only each row's non-zero span is kept), the window and an
/// FFT plan.
pub struct MelFrontEnd {
    n_mels: usize,
    /// Per mel row: the first non-zero bin and the weights from there.
    filters: Vec<(usize, Vec<f64>)>,
    window: Vec<f64>,
    fft: Arc<dyn RealToComplex<f64>>,
}

impl std::fmt::Debug for MelFrontEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MelFrontEnd")
            .field("n_mels", &self.n_mels)
            .finish()
    }
}

impl MelFrontEnd {
    /// The front end of an `n_mels`-bin model; only openai-whisper's 80-bin bank ships with
    /// the engine.
    pub fn new(n_mels: usize) -> Option<Self> {
        if n_mels != 80 {
            return None;
        }
        let all: Vec<f32> = MEL_80
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        debug_assert_eq!(all.len(), 80 * N_BINS);
        let filters = all
            .chunks_exact(N_BINS)
            .map(|row| {
                let first = row.iter().position(|&w| w != 0.0).unwrap_or(0);
                let last = row.iter().rposition(|&w| w != 0.0).map_or(first, |l| l + 1);
                (first, row[first..last].iter().map(|&w| w as f64).collect())
            })
            .collect();
        let window = (0..N_FFT)
            .map(|n| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64).cos())
            .collect();
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT);
        Some(Self {
            n_mels,
            filters,
            window,
            fft,
        })
    }

    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// The log-mel spectrogram of `samples` followed by `trailing_zeros` zero samples:
    /// `(samples.len() + trailing_zeros) / 160` frames. openai-whisper / HF / vLLM pad a clip
    /// to 480 000 samples first; faster-whisper appends 160.
    pub fn log_mel(&self, samples: &[f32], trailing_zeros: usize) -> LogMel {
        let n = samples.len() + trailing_zeros;
        let n_frames = n / HOP_LENGTH;
        let mut data = vec![0f32; self.n_mels * n_frames];
        if n_frames == 0 {
            return LogMel {
                n_mels: self.n_mels,
                n_frames,
                data,
            };
        }
        let pad = N_FFT / 2;
        // Sample `i` of the centre-padded signal (reflect mode, numpy's repeated reflection
        // when the pad is longer than the signal).
        let sample = |i: usize| -> f64 {
            let j = reflect(i as isize - pad as isize, n);
            if j < samples.len() {
                samples[j] as f64
            } else {
                0.0
            }
        };
        let mut log_max = f32::NEG_INFINITY;
        let mut frame = self.fft.make_input_vec();
        let mut spectrum = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut power = vec![0f64; N_BINS];
        for t in 0..n_frames {
            let start = t * HOP_LENGTH;
            for (k, v) in frame.iter_mut().enumerate() {
                *v = sample(start + k) * self.window[k];
            }
            self.fft
                .process_with_scratch(&mut frame, &mut spectrum, &mut scratch)
                .expect("buffers come from the plan");
            for (p, c) in power.iter_mut().zip(&spectrum) {
                *p = c.re * c.re + c.im * c.im;
            }
            for (m, (first, w)) in self.filters.iter().enumerate() {
                let mel: f64 = w.iter().zip(&power[*first..]).map(|(a, b)| a * b).sum();
                let v = mel.max(1e-10).log10() as f32;
                log_max = log_max.max(v);
                data[m * n_frames + t] = v;
            }
        }
        let floor = log_max - 8.0;
        for v in &mut data {
            *v = (v.max(floor) + 4.0) / 4.0;
        }
        LogMel {
            n_mels: self.n_mels,
            n_frames,
            data,
        }
    }
}

/// numpy's `reflect` padding index: `i` in `(-∞, ∞)` folded into `[0, n)` without repeating
/// the edge samples.
fn reflect(i: isize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let m = i.rem_euclid(period);
    (if m < n as isize { m } else { period - m }) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflect_matches_numpy() {
        // np.pad([0,1,2,3], 3, mode="reflect") = [3,2,1,0,1,2,3,2,1,0]
        let got: Vec<usize> = (-3..7).map(|i| reflect(i, 4)).collect();
        assert_eq!(got, vec![3, 2, 1, 0, 1, 2, 3, 2, 1, 0]);
        assert_eq!(reflect(-5, 1), 0);
    }

    #[test]
    fn frame_counts_and_floor() {
        let fe = MelFrontEnd::new(80).expect("test data");
        assert!(MelFrontEnd::new(128).is_none());
        let tone: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.1).sin() * 0.5).collect();
        let mel = fe.log_mel(&tone, 160);
        assert_eq!((mel.n_mels, mel.n_frames), (80, 7));
        let max = mel.data.iter().copied().fold(f32::MIN, f32::max);
        let min = mel.data.iter().copied().fold(f32::MAX, f32::min);
        assert!(
            max - min <= 2.0 + 1e-6,
            "the floor is max − 8 in log10, 2 after scaling"
        );
        // Short input: fewer samples than the centre pad still works (repeated reflection).
        assert_eq!(fe.log_mel(&tone[..50], 110).n_frames, 1);
        assert_eq!(fe.log_mel(&[], 0).n_frames, 0);
    }
}
