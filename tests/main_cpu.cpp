// tests/main_cpu.cpp: main of the CPU test executables (see main.cpp).
int run_tests(int argc, char** argv, bool needs_gpu);
int main(int argc, char** argv) { return run_tests(argc, argv, false); }
