// Command etcd is the etcd server, built from the pinned go.etcd.io/etcd/server/v3
// module so the test bed needs no prebuilt download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
