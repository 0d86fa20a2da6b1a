// kube-controller-manager as upstream builds it (cmd/kube-controller-manager/controller-manager.go),
// plus one flag for tests: --attach-detach-max-wait-for-unmount, the attach-detach controller's
// longest wait for a volume to be unmounted from a node before it detaches anyway
// (attachdetach.DefaultTimerConfig.ReconcilerMaxWaitForUnmountDuration, 6 minutes). Upstream's
// own integration tests set that timer to seconds (test/integration/volume/attach_detach_test.go
// builds the controller with its own TimerConfig); the binary has no flag for it. Left unset, the
// timer is upstream's.
package main

import (
	"os"
	_ "time/tzdata" // for CronJob Time Zone support

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugin
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
	"k8s.io/kubernetes/pkg/controller/volume/attachdetach"
)

func main() {
	command := app.NewControllerManagerCommand()
	timers := &attachdetach.DefaultTimerConfig
	command.Flags().DurationVar(&timers.ReconcilerMaxWaitForUnmountDuration,
		"attach-detach-max-wait-for-unmount", timers.ReconcilerMaxWaitForUnmountDuration,
		"(questdb-operator tests) the attach-detach controller's longest wait for an unmount before it detaches anyway")
	os.Exit(cli.Run(command))
}
