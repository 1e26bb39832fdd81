// Command pause sleeps until it is told to stop. It is the sandbox ("pause") container of every
// pod on a real test machine and, being a process that really runs, the test workload too. PID 1
// of a container gets no default signal handlers, so it must catch SIGTERM and SIGINT itself or
// a graceful stop would wait out the kubelet's grace period.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
