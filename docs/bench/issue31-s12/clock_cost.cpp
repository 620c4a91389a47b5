#include <x86intrin.h>
#include <chrono>
#include <cstdio>
int main() {
  using C = std::chrono::steady_clock;
  for (int k = 0; k < 3; k++) {
    auto t0 = C::now();
    long s = 0;
    const int N = 2000000;
    for (int i = 0; i < N; i++) s += C::now().time_since_epoch().count();
    auto t1 = C::now();
    unsigned long long r0 = __rdtsc();
    for (int i = 0; i < N; i++) s += __rdtsc();
    unsigned long long r1 = __rdtsc();
    auto t2 = C::now();
    printf("steady_clock::now %.1f ns, rdtsc %.1f ns (%llu cycles) %ld\n",
           std::chrono::duration<double, std::nano>(t1 - t0).count() / N,
           std::chrono::duration<double, std::nano>(t2 - t1).count() / N, (r1 - r0) / N, s & 1);
  }
}
