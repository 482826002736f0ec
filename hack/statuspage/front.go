package main

import (
	"net/http"
	"net/http/httputil"
	"net/url"
)

// authFront proxies to the discovery server, adding the bearer token.
func authFront(target, token string) http.Handler {
	u, _ := url.Parse(target)
	p := httputil.NewSingleHostReverseProxy(u)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("Authorization", "Bearer "+token)
		p.ServeHTTP(w, r)
	})
}
