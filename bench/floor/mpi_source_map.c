// What the owner's side of a remote read costs on this machine: rank 1 sends a tmpfs file it
// holds (its pages in the page cache) to rank 0's reused mapping, (a) from a mapping populated
// once and kept, (b) from a fresh mapping without MAP_POPULATE (what cluster/provide.rs does per
// request: the receiver's single-copy read faults the owner's pages in), (c) from a fresh mapping
// with MAP_POPULATE (the owner pays it before sending).
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
  size_t n=(size_t)atol(argv[1]); int reps=atoi(argv[2]);
  if(r==1){
    int fd=open("/dev/shm/floor-sm-src",O_RDWR|O_CREAT|O_TRUNC,0600); ftruncate(fd,n);
    char*m=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); for(size_t i=0;i<n;i++) m[i]=i*7; munmap(m,n);
    char*pop=mmap(0,n,PROT_READ,MAP_SHARED|MAP_POPULATE,fd,0);
    for(int mode=0;mode<3;mode++) for(int k=0;k<reps;k++){ MPI_Barrier(MPI_COMM_WORLD);
      char*src=pop; double t0=now();
      if(mode==1) src=mmap(0,n,PROT_READ,MAP_SHARED,fd,0);
      if(mode==2) src=mmap(0,n,PROT_READ,MAP_SHARED|MAP_POPULATE,fd,0);
      double t1=now();
      MPI_Send(src,n,MPI_BYTE,0,1,MPI_COMM_WORLD);
      if(mode>0) munmap(src,n);
      double tt=t1-t0; MPI_Send(&tt,1,MPI_DOUBLE,0,2,MPI_COMM_WORLD);
    }
    unlink("/dev/shm/floor-sm-src");
  } else {
    const char*names[3]={"sender mapping populated, kept","sender maps fresh, no populate","sender maps fresh with MAP_POPULATE"};
    int rfd=open("/dev/shm/floor-sm-dst",O_RDWR|O_CREAT|O_TRUNC,0600); fallocate(rfd,0,0,n);
    char*dst=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,rfd,0); memset(dst,0,n);
    for(int mode=0;mode<3;mode++){ double tot=0,tm=0;
      for(int k=0;k<reps;k++){ MPI_Barrier(MPI_COMM_WORLD); double t0=now();
        MPI_Recv(dst,n,MPI_BYTE,1,1,MPI_COMM_WORLD,MPI_STATUS_IGNORE); double t1=now(); double tt;
        MPI_Recv(&tt,1,MPI_DOUBLE,1,2,MPI_COMM_WORLD,MPI_STATUS_IGNORE);
        if(k>0){tot+=t1-t0; tm+=tt;} }
      printf("%zu B, %s: barrier->received %.3f ms (sender's map %.3f ms)\n",n,names[mode],tot/(reps-1)*1e3,tm/(reps-1)*1e3);}
    unlink("/dev/shm/floor-sm-dst");
  }
  MPI_Finalize();
}
