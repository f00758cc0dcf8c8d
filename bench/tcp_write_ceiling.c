// The ceiling for a bulk write over loopback TCP on this machine: one sender writes
// 2 GiB in 8 MiB write(2) calls, as the Locus client does, and the receiver moves it
// socket -> pipe -> file with splice(2), as `locus serve` does, with nothing else
// (no framing, no protocol, no counters). Sender on CPU 0, receiver on CPU 1, as
// `locus bench ops --placement spread` places them.
//
//   cc -O2 -o /tmp/tcp_write_ceiling bench/tcp_write_ceiling.c
//   /tmp/tcp_write_ceiling file    # into /dev/shm/tcpmax.bin (remove it afterwards)
//   /tmp/tcp_write_ceiling null    # into /dev/null
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <time.h>
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
int main(int argc,char**argv){
  int tofile = argc>1 && !strcmp(argv[1],"file");
  long N = 2L<<30;
  int l=socket(AF_INET,SOCK_STREAM,0); struct sockaddr_in a={.sin_family=AF_INET,.sin_addr.s_addr=htonl(0x7f000001)};
  bind(l,(void*)&a,sizeof a); socklen_t al=sizeof a; getsockname(l,(void*)&a,&al); listen(l,1);
  if(fork()==0){ pin(1); int c=accept(l,0,0); int p[2]; pipe(p); fcntl(p[1],F_SETPIPE_SZ,65536);
    int out = tofile? open("/dev/shm/tcpmax.bin",O_WRONLY|O_CREAT,0644) : open("/dev/null",O_WRONLY);
    long got=0; loff_t off=0;
    while(got<N){ ssize_t n=splice(c,0,p[1],0,65536,SPLICE_F_MOVE); if(n<=0)break; got+=n;
      ssize_t m=0; while(m<n){ ssize_t k= tofile? splice(p[0],0,out,&off,n-m,SPLICE_F_MOVE): splice(p[0],0,out,0,n-m,SPLICE_F_MOVE); if(k<=0){perror("splice");exit(1);} m+=k; } }
    write(c,"x",1); _exit(0);}
  pin(0); int s=socket(AF_INET,SOCK_STREAM,0); connect(s,(void*)&a,sizeof a);
  char*buf=malloc(8<<20); memset(buf,'z',8<<20);
  struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
  long sent=0; while(sent<N){ ssize_t n=write(s,buf,8<<20); if(n<=0){perror("write");exit(1);} sent+=n; }
  char x; read(s,&x,1); clock_gettime(CLOCK_MONOTONIC,&t1);
  double dt=(t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)/1e9;
  printf("%s %.0f MB/s\n", tofile?"file":"null", N/dt/1e6); wait(0); return 0;}
