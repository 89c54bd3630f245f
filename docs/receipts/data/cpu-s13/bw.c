#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(){ size_t n=(size_t)atoi(getenv("MB"))<<20; char*p=aligned_alloc(64,n); for(size_t i=0;i<n;i+=4096)p[i]=1; for(size_t i=0;i<n;i++)p[i]=i;
 double best=1e9; __m512i acc=_mm512_setzero_si512();
 for(int r=0;r<5;r++){struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
 for(size_t i=0;i<n;i+=256){acc=_mm512_add_epi32(acc,_mm512_load_si512(p+i));acc=_mm512_add_epi32(acc,_mm512_load_si512(p+i+64));acc=_mm512_add_epi32(acc,_mm512_load_si512(p+i+128));acc=_mm512_add_epi32(acc,_mm512_load_si512(p+i+192));}
 clock_gettime(CLOCK_MONOTONIC,&t1); double dt=(t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; if(dt<best)best=dt;}
 printf("%.1f GB/s (%d)\n", n/best/1e9, _mm512_reduce_add_epi32(acc));}
