// Control-message latency between two ranks that poll with MPI_Improbe and nap (like granary's
// communication loop): rank 0 sends a 25-byte message every 3 ms, rank 1 answers it.
// Arguments: the nap in µs (0: spin), and how many MPI_Improbe calls per turn before a nap
// (MPI_Improbe progresses after matching: what arrives during a nap is matched by a second call).
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int cmp(const void*a,const void*b){double x=*(const double*)a,y=*(const double*)b;return x<y?-1:x>y;}
static void nap(long us){struct timespec t={0,us*1000};nanosleep(&t,0);}
static int probes=1;
static void wait_msg(int src, char*buf, long napus){ int flag=0; MPI_Message m; MPI_Status st;
  for(;;){ for(int i=0;i<probes&&!flag;i++) MPI_Improbe(src,1,MPI_COMM_WORLD,&flag,&m,&st); if(flag)break; if(napus) nap(napus); }
  MPI_Mrecv(buf,64,MPI_BYTE,&m,&st); }
int main(int argc,char**argv){ int provided; MPI_Init_thread(&argc,&argv,MPI_THREAD_SERIALIZED,&provided); int r; MPI_Comm_rank(MPI_COMM_WORLD,&r);
  long napus=atol(argv[1]); if(argc>2) probes=atoi(argv[2]); int reps=200; char buf[64]={0}; double v[200];
  for(int k=0;k<reps;k++){ if(r==0){ nap(3000); double t0=now(); MPI_Request q; MPI_Isend(buf,25,MPI_BYTE,1,1,MPI_COMM_WORLD,&q); MPI_Wait(&q,MPI_STATUS_IGNORE); wait_msg(1,buf,napus); double t=now()-t0; v[k]=t; }
    else { wait_msg(0,buf,napus); MPI_Request q; MPI_Isend(buf,14,MPI_BYTE,0,1,MPI_COMM_WORLD,&q); MPI_Wait(&q,MPI_STATUS_IGNORE);} }
  if(r==0){ qsort(v,reps,sizeof(double),cmp); printf("nap %ld us, %d probe(s) per turn: round trip median %.0f us, p90 %.0f us\n",napus,probes,v[reps/2]*1e6,v[reps*9/10]*1e6);}
  MPI_Finalize(); }
