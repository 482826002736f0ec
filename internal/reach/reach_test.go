package reach_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/reach"
)

func TestCheck(t *testing.T) {
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	tenNet := netip.MustParsePrefix("10.1.0.0/16")
	external := reach.Rule{NoLoopback: true, NoPrivate: true}
	permitted := reach.Rule{NoLoopback: true, NoPrivate: true, Permitted: &reach.Networks{tenNet, loopback, netip.MustParsePrefix("169.254.0.0/16")}}
	local := reach.Rule{}
	managed := reach.Rule{NoLoopback: true}
	cases := []struct {
		reason string
		rule   reach.Rule
		addr   string
		ok     bool
	}{
		{"a public address serves every kind", external, "198.18.0.7", true},
		{"a public IPv6 address too", external, "2606:4700::1", true},
		{"the AWS and GCP metadata server never", local, "169.254.169.254", false},
		{"nor when a policy lists link-local", permitted, "169.254.169.254", false},
		{"nor link-local elsewhere", permitted, "169.254.10.1", false},
		{"nor the GCP IPv6 metadata server", managed, "fd20:ce::254", false},
		{"nor IPv6 link-local", local, "fe80::1", false},
		{"nor an IPv4-mapped metadata address", managed, "::ffff:169.254.169.254", false},
		{"nor Alibaba's metadata server, in CGNAT space", managed, "100.100.100.200", false},
		{"nor the unspecified address, which reaches the host", local, "0.0.0.0", false},
		{"nor broadcast", managed, "255.255.255.255", false},
		{"nor multicast", managed, "224.0.0.1", false},
		{"loopback not for an External proxy", external, "127.0.0.1", false},
		{"nor IPv4-mapped loopback", external, "::ffff:127.0.0.1", false},
		{"loopback not for a pod or a VM", managed, "127.0.0.1", false},
		{"loopback for a local proxy bound there", local, "127.0.0.1", true},
		{"IPv6 loopback too", local, "::1", true},
		{"loopback when the platform permits it", permitted, "127.0.0.5", true},
		{"private not for an External proxy", external, "10.1.2.3", false},
		{"nor CGNAT", external, "100.64.0.1", false},
		{"nor unique-local", external, "fd00::1", false},
		{"private for a pod", managed, "10.244.0.12", true},
		{"private inside the permitted networks", permitted, "10.1.2.3", true},
		{"but not outside them", permitted, "10.2.0.1", false},
		{"the metadata server behind NAT64, even permitted", plus(permitted, "64:ff9b::/96"), "64:ff9b::a9fe:a9fe", false},
		{"behind 6to4", managed, "2002:a9fe:a9fe::1", false},
		{"behind IPv4-translated", managed, "::ffff:0:a9fe:a9fe", false},
		{"a private address behind NAT64 is private", external, "64:ff9b::a00:1", false},
		{"a public one behind NAT64 is public", external, "64:ff9b::c612:7", true},
		{"nor 0.0.0.0/8, which Linux takes for the host", local, "0.0.0.1", false},
		{"the unspecified address for a local proxy bound to every address", reach.Rule{Unspecified: true}, "0.0.0.0", true},
		{"IPv6's too", reach.Rule{Unspecified: true}, "::", true},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			err := tc.rule.Check(netip.MustParseAddr(tc.addr))
			if (err == nil) != tc.ok {
				t.Fatalf("Check(%s) = %v, want allowed %v", tc.addr, err, tc.ok)
			}
			if err != nil && !errors.Is(err, reach.ErrRefused) {
				t.Errorf("Check(%s) = %v, not ErrRefused", tc.addr, err)
			}
		})
	}
}

// plus is r with cidr permitted besides.
func plus(r reach.Rule, cidr string) reach.Rule {
	n := append(reach.Networks{netip.MustParsePrefix(cidr)}, *r.Permitted...)
	r.Permitted = &n
	return r
}

func TestFor(t *testing.T) {
	permitted, err := reach.ParseNetworks([]string{"10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reach.ParseNetworks([]string{"10.0.0.0/33"}); err == nil || !strings.Contains(err.Error(), "10.0.0.0/33") {
		t.Errorf("ParseNetworks of a bad CIDR: %v, want an error naming it", err)
	}
	external := &v1alpha1.Proxy{Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{Mode: v1alpha1.ProxyModeExternal, Endpoint: &v1alpha1.Endpoint{Host: "x", Port: 1}}}}
	localLoopback := &v1alpha1.Proxy{Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{Local: &v1alpha1.LocalPlacement{}}}}
	localWide := &v1alpha1.Proxy{Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{Local: &v1alpha1.LocalPlacement{BindAddress: "10.0.0.4"}}}}
	localAll := &v1alpha1.Proxy{Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{Local: &v1alpha1.LocalPlacement{BindAddress: "0.0.0.0"}}}}
	pod := &v1alpha1.Proxy{Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{Kubernetes: &v1alpha1.KubernetesPlacement{}}}}
	tenantPod := pod.DeepCopy()
	tenantPod.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: v1alpha1.ProviderConfigKind, Name: "own"})
	tenantLocal := localLoopback.DeepCopy()
	tenantLocal.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: v1alpha1.ProviderConfigKind, Name: "own"})
	for name, tc := range map[string]struct {
		p        *v1alpha1.Proxy
		loopback bool
		private  string
	}{
		"External":                {external, false, "10.9.9.9"},
		"local on loopback":       {localLoopback, true, "192.168.1.1"},
		"local on a host address": {localWide, false, "192.168.1.1"},
		"local on every address":  {localAll, true, "192.168.1.1"},
		"pod":                     {pod, false, "172.16.0.1"},
		"tenant's pod, permitted": {tenantPod, false, "10.9.9.9"},
		"tenant's local proxy":    {tenantLocal, true, "10.9.9.9"},
	} {
		r := reach.For(tc.p, permitted)
		if got := r.Check(netip.MustParseAddr("127.0.0.1")) == nil; got != tc.loopback {
			t.Errorf("%s: loopback allowed %v, want %v", name, got, tc.loopback)
		}
		if err := r.Check(netip.MustParseAddr(tc.private)); err != nil {
			t.Errorf("%s: %s refused: %v", name, tc.private, err)
		}
	}
	for name, p := range map[string]*v1alpha1.Proxy{"External": external, "a namespaced ProviderConfig's pod": tenantPod, "a namespaced ProviderConfig's local proxy": tenantLocal} {
		if err := reach.For(p, permitted).Check(netip.MustParseAddr("172.16.0.1")); !errors.Is(err, reach.ErrRefused) {
			t.Errorf("%s: a private address outside the permitted networks was allowed, or not refused as such: %v", name, err)
		}
	}
	if err := reach.For(localAll, nil).Check(netip.MustParseAddr("0.0.0.0")); err != nil {
		t.Errorf("a local proxy bound to every address, published at 0.0.0.0: %v", err)
	}
}

// TestDialChecksTheResolvedAddress dials a listener on loopback by a name
// that resolves there: refused for an External proxy, before anything is
// sent, and served for a local proxy bound to loopback.
func TestDialChecksTheResolvedAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() //nolint:errcheck // A test listener.
	accepted := make(chan struct{}, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			_ = c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ctx := context.Background()
	for _, addr := range []string{ln.Addr().String(), net.JoinHostPort("localhost", port)} {
		if c, err := (reach.Rule{NoLoopback: true, NoPrivate: true}).Dial(ctx, "tcp4", addr, time.Second); err == nil {
			_ = c.Close()
			t.Fatalf("an External proxy's dial of %s was let through", addr)
		} else if !errors.Is(err, reach.ErrRefused) {
			t.Fatalf("dial of %s: %v, want ErrRefused", addr, err)
		}
	}
	select {
	case <-accepted:
		t.Fatal("a refused dial reached the listener")
	case <-time.After(100 * time.Millisecond):
	}
	c, err := (reach.Rule{}).Dial(ctx, "tcp4", net.JoinHostPort("localhost", port), time.Second)
	if err != nil {
		t.Fatalf("a local proxy bound to loopback: %v", err)
	}
	_ = c.Close()
	// The metadata server is refused in Control, before connect(2).
	if err := (reach.Rule{}).Control("tcp4", "169.254.169.254:80", nil); !errors.Is(err, reach.ErrRefused) {
		t.Fatalf("Control(169.254.169.254:80) = %v, want ErrRefused", err)
	}
}
