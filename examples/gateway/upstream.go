package main

import (
	"net"
	"net/http"
	"time"
)

// demoUpstream is the service behind the gateway when no -upstream is given: it answers
// every request with a small JSON body naming what it received.
func demoUpstream() (addr string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{
			"upstream": "demo", "method": r.Method, "path": r.URL.Path, "tenant": r.Header.Get("X-Api-Key"),
		})
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	return "http://" + l.Addr().String(), func() { srv.Close() }, nil
}
