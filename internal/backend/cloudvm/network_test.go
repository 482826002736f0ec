package cloudvm_test

import (
	"fmt"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm"
)

var ec2 = cloudvm.Cloud{Placement: "aws", UserDataField: "userData", OpeningKind: "an EC2 security group"}

// TestSourceRanges: the ranges an opening admits, and the refusals each
// cloud's errors name its own fields in.
func TestSourceRanges(t *testing.T) {
	creds := &backend.Credentials{Username: "u", Password: "p"}
	for name, c := range map[string]struct {
		s       backend.Spec
		want    string
		refused string
	}{
		"credentials only: every IPv4 address": {s: backend.Spec{Credentials: creds}, want: "0.0.0.0/0"},
		"host bits masked":                     {s: backend.Spec{Credentials: creds, AllowedSourceRanges: []string{"203.0.113.7/24"}}, want: "203.0.113.0/24"},
		"public without credentials":           {s: backend.Spec{AllowedSourceRanges: []string{"203.0.113.0/24"}}, refused: fmt.Sprintf(cloudvm.ErrFmtOpenProxy, "203.0.113.0/24")},
		"probe range public without credentials": {
			s: backend.Spec{AllowedSourceRanges: []string{"10.0.0.0/8", "198.51.100.0/24"}, ProbeSourceRanges: []string{"198.51.100.0/24"}}, refused: fmt.Sprintf(cloudvm.ErrFmtPublicProbeRange, "198.51.100.0/24"),
		},
		"own user data without ranges": {s: backend.Spec{Credentials: creds, UserData: "#!/bin/sh"}, refused: fmt.Sprintf(cloudvm.ErrFmtUserDataWithoutRanges, "aws", "userData", "an EC2 security group")},
		"private clients at an external IP": {
			s: backend.Spec{Credentials: creds, AllowedSourceRanges: []string{"10.0.0.0/8"}}, refused: fmt.Sprintf(cloudvm.ErrFmtPrivateOnly, []string{"10.0.0.0/8"}, "list the crawlers' external ranges (with authSecretRef)"),
		},
		"IPv6": {s: backend.Spec{Credentials: creds, AllowedSourceRanges: []string{"2001:db8::/32"}}, refused: fmt.Sprintf(cloudvm.ErrFmtIPv4Only, "2001:db8::/32", "an EC2 security group")},
	} {
		got, err := cloudvm.SourceRanges(c.s, ec2, false)
		switch {
		case c.refused != "" && (err == nil || backend.ClassOf(err) != backend.ClassPermanent || err.Error() != c.refused):
			t.Errorf("%s: %v, %v; want the permanent refusal %q", name, got, err, c.refused)
		case c.refused == "" && (err != nil || strings.Join(got, ",") != c.want):
			t.Errorf("%s: %v, %v; want %s", name, got, err, c.want)
		}
	}
	if _, err := cloudvm.SourceRanges(backend.Spec{Credentials: creds, AllowedSourceRanges: []string{"10.0.0.0/8"}}, ec2, true); err != nil {
		t.Errorf("private clients at a published private address: %v", err)
	}
}

// TestSharedName: a fleet's opening is named by what it is, whatever the
// order of its ranges, and differs with any part.
func TestSharedName(t *testing.T) {
	a := cloudvm.SharedName("egress-sg-", "c1", "team", "crawlers", "vpc-1", "tcp:3128", []string{"10.0.0.0/8", "203.0.113.0/24"})
	if b := cloudvm.SharedName("egress-sg-", "c1", "team", "crawlers", "vpc-1", "tcp:3128", []string{"203.0.113.0/24", "10.0.0.0/8"}); a != b {
		t.Errorf("the ranges' order changed the name: %s, %s", a, b)
	}
	if !strings.HasPrefix(a, "egress-sg-") || len(a) != len("egress-sg-")+16 {
		t.Errorf("name %q", a)
	}
	for i, other := range []string{
		cloudvm.SharedName("egress-sg-", "c2", "team", "crawlers", "vpc-1", "tcp:3128", []string{"10.0.0.0/8", "203.0.113.0/24"}),
		cloudvm.SharedName("egress-sg-", "c1", "team2", "crawlers", "vpc-1", "tcp:3128", []string{"10.0.0.0/8", "203.0.113.0/24"}),
		cloudvm.SharedName("egress-sg-", "c1", "team", "crawlers", "vpc-2", "tcp:3128", []string{"10.0.0.0/8", "203.0.113.0/24"}),
		cloudvm.SharedName("egress-sg-", "c1", "team", "crawlers", "vpc-1", "tcp:3129", []string{"10.0.0.0/8", "203.0.113.0/24"}),
		cloudvm.SharedName("egress-sg-", "c1", "team", "crawlers", "vpc-1", "tcp:3128", []string{"10.0.0.0/8"}),
	} {
		if other == a {
			t.Errorf("part %d changed, name did not: %s", i, a)
		}
	}
}
