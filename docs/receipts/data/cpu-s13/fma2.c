#include <immintrin.h>
#include <stdio.h>
#include <time.h>
int main(){ 
 __m512 a0=_mm512_set1_ps(0.1f),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,a8=a0,a9=a0,a10=a0,a11=a0;
 __m512 m=_mm512_set1_ps(0.9999f), b=_mm512_set1_ps(0.0001f);
 struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
 long N=200000000;
 for(long n=0;n<N;n++){ a0=_mm512_fmadd_ps(a0,m,b);a1=_mm512_fmadd_ps(a1,m,b);a2=_mm512_fmadd_ps(a2,m,b);a3=_mm512_fmadd_ps(a3,m,b);a4=_mm512_fmadd_ps(a4,m,b);a5=_mm512_fmadd_ps(a5,m,b);a6=_mm512_fmadd_ps(a6,m,b);a7=_mm512_fmadd_ps(a7,m,b);a8=_mm512_fmadd_ps(a8,m,b);a9=_mm512_fmadd_ps(a9,m,b);a10=_mm512_fmadd_ps(a10,m,b);a11=_mm512_fmadd_ps(a11,m,b);__asm__ volatile(""::"v"(a0),"v"(a1),"v"(a2),"v"(a3),"v"(a4),"v"(a5),"v"(a6),"v"(a7),"v"(a8),"v"(a9),"v"(a10),"v"(a11));}
 clock_gettime(CLOCK_MONOTONIC,&t1);
 double dt=(t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; printf("%.3f s  %.2f FMA instr/ns\n",dt,N*12/dt/1e9);}
