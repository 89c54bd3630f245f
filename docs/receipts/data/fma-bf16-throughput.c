// Throughput of 512-bit vfmadd231ps vs vdpbf16ps: 12 independent accumulators per loop.
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 2000000000L
int main(void){
  __m512 a[12]; __m512 x=_mm512_set1_ps(1.0001f), y=_mm512_set1_ps(0.9999f);
  for(int i=0;i<12;i++) a[i]=_mm512_set1_ps((float)i);
  double t0=now();
  for(long i=0;i<N/12;i++){
    #pragma GCC unroll 12
    for(int j=0;j<12;j++) a[j]=_mm512_fmadd_ps(x,y,a[j]);
  }
  double t1=now();
  __m512bh bx=_mm512_cvtne2ps_pbh(x,y), by=_mm512_cvtne2ps_pbh(y,x);
  __m512 b[12]; for(int i=0;i<12;i++) b[i]=_mm512_set1_ps((float)i);
  double t2=now();
  for(long i=0;i<N/12;i++){
    #pragma GCC unroll 12
    for(int j=0;j<12;j++) b[j]=_mm512_dpbf16_ps(b[j],bx,by);
  }
  double t3=now();
  float s=0; for(int i=0;i<12;i++){ s+=_mm512_reduce_add_ps(a[i])+_mm512_reduce_add_ps(b[i]); }
  printf("fma: %.2f G instr/s (%.1f GFLOP-MAC/s)  dpbf16: %.2f G instr/s (%.1f G MAC/s)  [%g]\n",
    N/(t1-t0)/1e9, N*16/(t1-t0)/1e9, N/(t3-t2)/1e9, N*32/(t3-t2)/1e9, s);
}
