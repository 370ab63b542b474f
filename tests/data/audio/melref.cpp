// Reference: llama.cpp 11434's whisper log-mel (mtmd-audio.cpp compiled as is) on raw f32 samples.
// usage: melref IN.f32 OUT.f32 -> prints n_mel n_len ; OUT = the full log-mel [n_mel][n_len] before chunking
#include "mtmd-audio.cpp"
#include <cstdio>
int main(int argc, char ** argv) {
    FILE * f = fopen(argv[1], "rb"); fseek(f, 0, SEEK_END); long n = ftell(f) / 4; fseek(f, 0, SEEK_SET);
    std::vector<float> s(n); fread(s.data(), 4, n, f); fclose(f);
    if (n < 201) s.resize(201, 0.0f);
    mtmd_audio_cache cache;
    cache.fill_sin_cos_table(400); cache.fill_hann_window(400, true); cache.fill_mel_filterbank_matrix(128, 400, 16000);
    filter_params p; p.n_mel = 128; p.n_fft_bins = 201; p.hann_window_size = 400; p.hop_length = 160; p.sample_rate = 16000;
    mtmd_audio_mel out;
    log_mel_spectrogram(s.data(), s.size(), 4, p, cache, out);
    FILE * o = fopen(argv[2], "wb"); fwrite(out.data.data(), 4, out.data.size(), o); fclose(o);
    printf("%lld %lld\n", (long long) out.n_mel, (long long) out.n_len);
}
