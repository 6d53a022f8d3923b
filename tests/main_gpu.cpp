// tests/main_gpu.cpp: main of the GPU test executable: skipped (exit 77) without a CUDA device.
int run_tests(int argc, char** argv, bool needs_gpu);
int main(int argc, char** argv) { return run_tests(argc, argv, true); }
