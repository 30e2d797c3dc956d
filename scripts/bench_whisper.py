"""The table of scripts/bench_whisper.sh: real-time factor per thread count for aphro and
faster-whisper (float32, int8) on the same clips, greedy with timestamps (faster-whisper's
options of the fixture reference). Compute only: audio is decoded before timing, one warm-up
run, then the fastest of RUNS."""
import argparse
import json
import subprocess
import time

RUNS = 3


def aphro_rtf(binary, model, clips, threads, concurrency=1):
    audio = compute = 0.0
    largest = 0
    for clip in clips:
        out = subprocess.run(
            [binary, "transcribe", "--model", model, clip, "--threads", str(threads),
             "--bench-runs", str(RUNS), "--bench-concurrency", str(concurrency)],
            check=True, capture_output=True, text=True,
        )
        stats = json.loads(out.stderr.strip().splitlines()[-1])
        audio += stats["audio_s"]
        compute += stats["compute_s"]
        largest = max(largest, stats.get("largest_batch", 1))
    if concurrency > 1:
        return audio, audio / compute, largest
    return audio, audio / compute


def fw_transcribe(m, samples):
    """faster-whisper with the options of the fixture reference (greedy, timestamps)."""
    return list(m.transcribe(samples, beam_size=1, temperature=0.0, vad_filter=False,
                             condition_on_previous_text=True, without_timestamps=False)[0])


def best_time(run):
    """The fastest of RUNS timed calls after one warm-up call."""
    run()
    best = float("inf")
    for _ in range(RUNS):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def faster_whisper_rtf(model, clips, threads, compute_type):
    from faster_whisper import WhisperModel, decode_audio

    m = WhisperModel(model, device="cpu", compute_type=compute_type, cpu_threads=threads)
    audio = compute = 0.0
    for clip in clips:
        samples = decode_audio(clip, 16000)
        compute += best_time(lambda: fw_transcribe(m, samples))
        audio += len(samples) / 16000
    return audio / compute


def faster_whisper_concurrent_rtf(model, clips, workers, copies):
    """`copies` transcriptions of each clip at once from as many Python threads, on a
    WhisperModel with `workers` CTranslate2 workers of one thread each (its way of serving
    concurrent requests)."""
    from concurrent.futures import ThreadPoolExecutor
    from faster_whisper import WhisperModel, decode_audio

    m = WhisperModel(model, device="cpu", compute_type="float32", cpu_threads=1,
                     num_workers=workers)
    audio = compute = 0.0
    with ThreadPoolExecutor(copies) as pool:
        for clip in clips:
            samples = decode_audio(clip, 16000)
            compute += best_time(
                lambda: list(pool.map(lambda _: fw_transcribe(m, samples), range(copies))))
            audio += copies * len(samples) / 16000
    return audio / compute


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--aphro", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("clips", nargs="+")
    a = ap.parse_args()
    print(f"Whisper tiny.en, CPU, {len(a.clips)} clips; RTF = audio seconds / compute seconds")
    print(f"{'threads':>7} {'audio s':>8} {'aphro f32':>10} {'fw f32':>8} {'fw int8':>8} {'aphro/fw f32':>13}")
    for threads in (1, 2):
        audio, aphro = aphro_rtf(a.aphro, a.model, a.clips, threads)
        f32 = faster_whisper_rtf(a.model, a.clips, threads, "float32")
        i8 = faster_whisper_rtf(a.model, a.clips, threads, "int8")
        print(f"{threads:>7} {audio:>8.1f} {aphro:>10.1f} {f32:>8.1f} {i8:>8.1f} {aphro / f32:>13.2f}")
    # Serving throughput: COPIES transcriptions of each clip at once on 2 cores. aphro
    # batches their decoding steps on one 2-thread pool; faster-whisper runs 2 workers.
    copies = a.concurrency
    print(f"\n{copies} at once, 2 cores; RTF = all copies' audio seconds / wall seconds")
    print(f"{'aphro f32 (batched)':>20} {'largest batch':>14} {'fw f32 (2 workers)':>19} {'aphro/fw':>9}")
    _, aphro, largest = aphro_rtf(a.aphro, a.model, a.clips, 2, copies)
    fw = faster_whisper_concurrent_rtf(a.model, a.clips, 2, copies)
    print(f"{aphro:>20.1f} {largest:>14} {fw:>19.1f} {aphro / fw:>9.2f}")


if __name__ == "__main__":
    main()
