#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
struct cfg { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed));
static int8_t buf[16*64] __attribute__((aligned(64)));
int main(){ syscall(SYS_arch_prctl, 0x1023, 18);
 struct cfg c; memset(&c,0,sizeof c); c.palette=1; for(int i=0;i<8;i++){c.colsb[i]=64;c.rows[i]=16;}
 for(int mode=0;mode<3;mode++){
 struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
 long N=200000;
 for(long n=0;n<N;n++){ _tile_loadconfig(&c); if(mode>=1){_tile_loadd(2,buf,64);_tile_loadd(4,buf,64);_tile_zero(0);_tile_dpbssd(0,2,4);_tile_stored(0,buf,64);} if(mode!=2)_tile_release(); }
 clock_gettime(CLOCK_MONOTONIC,&t1);
 double dt=(t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; printf("mode %d: %.1f ns per iteration\n",mode,dt*1e9/N);}
}
