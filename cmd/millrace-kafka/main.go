// Command millrace-kafka runs millrace's embedded Kafka-protocol broker
// (franz-go's kfake) on a loopback port, for development and for examples
// that run in another process. It is not a production broker.
//
//	millrace-kafka -port 9092 -partitions 8 -data-dir /tmp/kafka
//
// It keeps its topics (auto-created ones included) and the records it
// acknowledged across restarts, also when it is killed with SIGKILL: a topic
// reaches the disk when it is created, records as they are acknowledged. A
// crash of the machine may lose the last records, which are not fsynced one
// by one. Without -data-dir the data goes to millrace-kafka-PORT in the
// temporary directory, so that a broker restarted on the same port finds it
// (with -port 0, to a new temporary directory each run).
//
// With -in-memory it keeps nothing: a restarted broker has no topics, and
// makes a topic again under a new topic id on first use. Running franz-go
// clients then fail with UNKNOWN_TOPIC_ID until they are restarted
// (millrace's kafka.Publisher renews its client by itself); consumer groups
// start over from their reset offsets.
//
// Consumer-group members whose connection is gone are evicted when their
// session times out, as Apache Kafka does, also when they died while
// joining.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/millrace/millrace/internal/devkafka"
)

func main() {
	var cfg devkafka.Config
	var inMemory bool
	flag.IntVar(&cfg.Port, "port", 9092, "port to listen on at 127.0.0.1 (0: a free port)")
	flag.IntVar(&cfg.Partitions, "partitions", 8, "partitions of auto-created topics")
	flag.StringVar(&cfg.DataDir, "data-dir", "", "keep topics and acknowledged records here across restarts, SIGKILL included (not across a machine crash); default: millrace-kafka-PORT in the temporary directory (a new temporary directory with -port 0)")
	flag.BoolVar(&inMemory, "in-memory", false, "keep nothing across restarts: a restarted broker has no topics, makes them again under new topic ids, and running franz-go clients fail with UNKNOWN_TOPIC_ID until restarted")
	flag.Parse()

	switch {
	case inMemory && cfg.DataDir != "":
		fmt.Fprintln(os.Stderr, "millrace-kafka: -in-memory and -data-dir exclude each other")
		os.Exit(2)
	case inMemory:
	case cfg.DataDir == "" && cfg.Port != 0:
		cfg.DataDir = filepath.Join(os.TempDir(), "millrace-kafka-"+strconv.Itoa(cfg.Port))
	case cfg.DataDir == "":
		dir, err := os.MkdirTemp("", "millrace-kafka-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cfg.DataDir = dir
	}

	b, err := devkafka.Start(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The address goes to stdout alone, so scripts can read it.
	fmt.Println(b.Addrs()[0])
	where := "data in memory only"
	if cfg.DataDir != "" {
		where = "data in " + cfg.DataDir
	}
	fmt.Fprintf(os.Stderr, "millrace-kafka: embedded broker listening on %s, %s; Ctrl-C to stop\n", b.Addrs()[0], where)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	b.Close()
}
