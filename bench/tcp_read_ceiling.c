// The ceiling for a bulk read over loopback TCP on this machine: the server sends a
// 256 MiB tmpfs file with sendfile(2), as `locus serve` does, and the client read(2)s
// it into a 4 MiB buffer, optionally with its low-water mark (SO_RCVLOWAT) at LOWAT
// bytes, never beyond what is still to come, as the Locus client does (256 KiB).
// Eight rounds on one connection; client on CPU 0, server on CPU 1.
//
//   cc -O2 -o /tmp/tcp_read_ceiling bench/tcp_read_ceiling.c
//   /tmp/tcp_read_ceiling 0         # no low-water mark
//   /tmp/tcp_read_ceiling 262144    # as the Locus client
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/sendfile.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
int main(int argc,char**argv){
  int lowat = argc>1 ? atoi(argv[1]) : 0;
  long N = 256L<<20; int rounds = 8;
  int fd=open("/dev/shm/tcpread.bin",O_RDWR|O_CREAT,0644); ftruncate(fd,N);
  char*z=malloc(1<<20); memset(z,'q',1<<20); for(long o=0;o<N;o+=1<<20) pwrite(fd,z,1<<20,o);
  int l=socket(AF_INET,SOCK_STREAM,0); struct sockaddr_in a={.sin_family=AF_INET,.sin_addr.s_addr=htonl(0x7f000001)};
  bind(l,(void*)&a,sizeof a); socklen_t al=sizeof a; getsockname(l,(void*)&a,&al); listen(l,1);
  if(fork()==0){ pin(1); int c=accept(l,0,0); char x;
    for(int r=0;r<rounds;r++){ if(read(c,&x,1)!=1)break; off_t off=0; while(off<N){ ssize_t n=sendfile(c,fd,&off,N-off); if(n<=0){perror("sendfile");exit(1);} } }
    _exit(0);}
  pin(0); int s=socket(AF_INET,SOCK_STREAM,0); connect(s,(void*)&a,sizeof a);
  if(lowat) setsockopt(s,SOL_SOCKET,SO_RCVLOWAT,&lowat,sizeof lowat);
  char*buf=malloc(4<<20);
  for(int r=0;r<rounds;r++){
    struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
    write(s,"g",1); long got=0; while(got<N){ if(lowat){ int w = N-got < lowat ? (int)(N-got) : lowat; setsockopt(s,SOL_SOCKET,SO_RCVLOWAT,&w,sizeof w);} ssize_t n=read(s,buf,4<<20); if(n<=0){perror("read");exit(1);} got+=n; }
    clock_gettime(CLOCK_MONOTONIC,&t1);
    double dt=(t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)/1e9;
    printf("%.0f ", N/dt/1e6);
  }
  printf("MB/s (lowat %d)\n", lowat); wait(0); unlink("/dev/shm/tcpread.bin"); return 0;}
