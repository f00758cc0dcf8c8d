// The ceiling for the S3 benchmark's clients on this machine: an HTTP server that does
// only what an S3 server cannot skip for a GET or a PUT of an object (read the request,
// read or discard the body, answer), with no signature check, no file system and no
// metadata. A GET answers the same 4 KiB from memory (or, for a key ending in
// ".big", SIZE_MIB of zeros, with one Range if asked); a PUT reads its body and answers
// an ETag (its MD5, as an S3 server must compute it). Given a DIR, a PUT also does the
// rest of what a server that checks signed payloads and keeps what it is sent cannot
// skip: the SHA-256 of the body (a SigV4 signed payload) and a write of it to a file in
// DIR (one per part number, written again each time).
//
//	go build -o /tmp/s3_ceiling bench/s3_ceiling.go && /tmp/s3_ceiling 127.0.0.1:PORT [SIZE_MIB [DIR]]
package main

import (
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

func main() {
	small := make([]byte, 4096)
	bigMiB := 1024
	if len(os.Args) > 2 {
		bigMiB, _ = strconv.Atoi(os.Args[2])
	}
	dir := ""
	if len(os.Args) > 3 {
		dir = os.Args[3]
	}
	chunk := make([]byte, 1<<20)
	h := func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPut, http.MethodPost:
			sum := md5.New()
			if dir == "" {
				io.Copy(sum, r.Body)
			} else {
				name := "part-" + r.URL.Query().Get("partNumber")
				f, err := os.Create(filepath.Join(dir, filepath.Base(name)))
				if err != nil {
					w.WriteHeader(http.StatusInternalServerError)
					return
				}
				io.Copy(io.MultiWriter(sum, sha256.New(), f), r.Body)
				f.Close()
			}
			w.Header().Set("ETag", "\""+hex.EncodeToString(sum.Sum(nil))+"\"")
			if r.URL.Query().Has("uploads") {
				fmt.Fprint(w, "<InitiateMultipartUploadResult><UploadId>u</UploadId></InitiateMultipartUploadResult>")
			}
		case http.MethodGet, http.MethodHead:
			w.Header().Set("ETag", "\"00000000000000000000000000000000\"")
			if strings.HasSuffix(r.URL.Path, ".big") {
				size := int64(bigMiB) << 20
				start, end := int64(0), size-1
				if rg := r.Header.Get("Range"); rg != "" {
					fmt.Sscanf(rg, "bytes=%d-%d", &start, &end)
					w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end, size))
				}
				w.Header().Set("Content-Length", strconv.FormatInt(end-start+1, 10))
				if r.Header.Get("Range") != "" {
					w.WriteHeader(http.StatusPartialContent)
				}
				for left := end - start + 1; left > 0 && r.Method == http.MethodGet; {
					n := min(left, int64(len(chunk)))
					w.Write(chunk[:n])
					left -= n
				}
				return
			}
			w.Header().Set("Content-Length", "4096")
			if r.Method == http.MethodGet {
				w.Write(small)
			}
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}
	if err := http.ListenAndServe(os.Args[1], http.HandlerFunc(h)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
