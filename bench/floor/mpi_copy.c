// Floor of a remote read on this machine: rank 1 holds a file in tmpfs (mapped), rank 0 receives
// it with MPI into (a) a fresh fallocated tmpfs file mapping, (b) the same mapping reused,
// (c) a reused malloc buffer; compared with reading a tmpfs file into a fresh buffer (local read).
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  MPI_Init(&argc,&argv); int r; MPI_Comm_rank(MPI_COMM_WORLD,&r);
  size_t n = (size_t)atol(argv[1]); int reps = atoi(argv[2]);
  char path[256];
  if(r==1){
    snprintf(path,256,"/dev/shm/floor-src");
    int fd=open(path,O_RDWR|O_CREAT|O_TRUNC,0600); ftruncate(fd,n);
    char*m=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); for(size_t i=0;i<n;i++) m[i]=i*7;
    munmap(m,n);
    char*src=mmap(0,n,PROT_READ,MAP_SHARED|MAP_POPULATE,fd,0);
    for(int mode=0;mode<3;mode++) for(int k=0;k<reps;k++){ MPI_Barrier(MPI_COMM_WORLD); MPI_Send(src,n,MPI_BYTE,0,1,MPI_COMM_WORLD);}
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    const char*names[3]={"fresh tmpfs file (fallocate+mmap)","reused tmpfs mapping","reused malloc buffer"};
    char*reuse=0; int rfd=-1; char*buf=malloc(n); memset(buf,1,n);
    for(int mode=0;mode<3;mode++){ double tot=0, talloc=0;
      for(int k=0;k<reps;k++){ MPI_Barrier(MPI_COMM_WORLD); double t0=now(); char*dst;
        int fd=-1;
        if(mode==0){ snprintf(path,256,"/dev/shm/floor-dst%d",k); fd=open(path,O_RDWR|O_CREAT|O_TRUNC,0600); fallocate(fd,0,0,n); dst=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);}
        else if(mode==1){ if(!reuse){ rfd=open("/dev/shm/floor-reuse",O_RDWR|O_CREAT|O_TRUNC,0600); fallocate(rfd,0,0,n); reuse=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,rfd,0); memset(reuse,0,n);} dst=reuse; }
        else dst=buf;
        double t1=now(); MPI_Recv(dst,n,MPI_BYTE,1,1,MPI_COMM_WORLD,MPI_STATUS_IGNORE); double t2=now();
        if(k>0){tot+=t2-t0; talloc+=t1-t0;}
        if(mode==0){munmap(dst,n); close(fd); unlink(path);} }
      printf("%zu B, %s: %.3f ms per file (alloc %.3f) = %.2f GB/s\n", n, names[mode], tot/(reps-1)*1e3, talloc/(reps-1)*1e3, n/(tot/(reps-1))/1e9);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    // local read: a tmpfs file read into a fresh malloc (like Python's f.read())
    int fd=open("/dev/shm/floor-reuse",O_RDONLY); double tot=0;
    for(int k=0;k<reps;k++){ double t0=now(); char*b=malloc(n); size_t got=0; while(got<n){ssize_t x=pread(fd,b+got,n-got,got); if(x<=0)break; got+=x;} double t1=now(); if(k>0)tot+=t1-t0; free(b);}
    printf("%zu B, local read into fresh malloc: %.3f ms = %.2f GB/s\n", n, tot/(reps-1)*1e3, n/(tot/(reps-1))/1e9);
    tot=0;
    for(int k=0;k<reps;k++){ double t0=now(); size_t got=0; while(got<n){ssize_t x=pread(fd,buf+got,n-got,got); if(x<=0)break; got+=x;} double t1=now(); if(k>0)tot+=t1-t0;}
    printf("%zu B, local read into reused buffer: %.3f ms = %.2f GB/s\n", n, tot/(reps-1)*1e3, n/(tot/(reps-1))/1e9);
    unlink("/dev/shm/floor-reuse");
  }
  if(r==1) unlink("/dev/shm/floor-src");
  MPI_Finalize();
}
