// The simulated nvidia-cuda-mps-control, compiled: the same tool as mps_control.py, for speed.
//
// mps_control.py is the reference and its docstring says what the tool does; this program does the same with
// the same files (pipe directory, control socket, control_lock, pid file, control.log) and writes the same
// records (one file per daemon beside the simulator state, in mps_records.py's format). A real control
// daemon starts in milliseconds; the Python one costs an interpreter start per run (50-150 ms), which made
// the simulator, not the driver, the bottleneck of every MPS benchmark.
// sim_driver_root.py builds this file with `go build` when Go is installed and points the driver root's shim
// at the result; without Go the shim runs mps_control.py. tests/hardware/test_sim_mps_control.py runs the
// tool's behaviour against both.
//
// Go cannot fork a running process, so `-d` starts this binary again as the daemon (`--daemon-child`, in its
// own session, the bound listener and a readiness pipe passed as file descriptors 3 and 4) and returns once
// the daemon has written its pid, as mps_control.py's double fork does.
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	socketName        = "control"
	pidFile           = "nvidia-cuda-mps-control.pid"
	lockFile          = "control_lock"
	busyMessage       = "Cannot send command to MPS control daemon process"
	notRunningMessage = "Cannot find MPS control daemon process"
	logFile           = "control.log"
	defaultPipeDir    = "/tmp/nvidia-mps"
	defaultLogDir     = "/var/log/nvidia-mps"
	statePath         = "var/lib/nvml-sim/state.json"
	recordsDir        = "var/lib/nvml-sim/mps" // mps_records.py's RECORDS_DIR
	keepStopped       = 50                     // mps_records.py's KEEP_STOPPED
	daemonChildFlag   = "--daemon-child"
)

var limitRE = regexp.MustCompile(`^([0-9]+)([MG])$`)

type commandError struct{ msg string }

func (e *commandError) Error() string { return e.msg }

func fail(format string, args ...any) error { return &commandError{fmt.Sprintf(format, args...)} }

// pyRepr quotes a string as Python's repr() does, so that messages read the same from both tools.
func pyRepr(s string) string {
	quote := "'"
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		quote = `"`
	}
	var b strings.Builder
	b.WriteString(quote)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case string(r) == quote:
			b.WriteString(`\` + quote)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteString(quote)
	return b.String()
}

// ------------------------------------------------------------------------------------------ simulator state

// stateStore reads the simulator state as StateStore does: under a shared flock on `state.json.lock`. The
// daemons never write it; they keep their own record files (record below).
type stateStore struct{ root, path, lockPath string }

func openStore() *stateStore {
	root := os.Getenv("DRA_GPU_SIM_ROOT")
	if root == "" {
		return nil
	}
	path := filepath.Join(root, statePath)
	return &stateStore{root: root, path: path, lockPath: path + ".lock"}
}

// read loads the state under a shared flock, as StateStore.read does: never a half-written file's content.
func (s *stateStore) read() (map[string]any, error) {
	if err := os.MkdirAll(filepath.Dir(s.lockPath), 0o777); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(s.lockPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close() // closing releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_SH); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return nil, fmt.Errorf("simulator state %s is unreadable: %w", s.path, err)
	}
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.UseNumber() // integers stay integers, as Python wrote them
	var state map[string]any
	if err := decoder.Decode(&state); err != nil {
		return nil, fmt.Errorf("simulator state %s is unreadable: %w", s.path, err)
	}
	return state, nil
}

func knownUUIDs(state map[string]any) map[string]bool {
	known := map[string]bool{}
	gpus, _ := state["gpus"].([]any)
	for _, g := range gpus {
		gpu, _ := g.(map[string]any)
		if uuid, ok := gpu["uuid"].(string); ok {
			known[uuid] = true
		}
		instances, _ := gpu["gpu_instances"].([]any)
		for _, gi := range instances {
			computes, _ := gi.(map[string]any)["compute_instances"].([]any)
			for _, ci := range computes {
				if uuid, ok := ci.(map[string]any)["uuid"].(string); ok {
					known[uuid] = true
				}
			}
		}
	}
	return known
}

// ------------------------------------------------------------------------------------------------ daemon

type daemon struct {
	pipeDir, logDir  string
	visible          []string
	store            *stateStore
	threadPercentage *int
	pinned           map[string]string
	multiUser        bool
	entry            map[string]any // this daemon's record
}

func (d *daemon) log(text string) {
	out, err := os.OpenFile(filepath.Join(d.logDir, logFile), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer out.Close()
	fmt.Fprintf(out, "[%s] %s\n", time.Now().Format("2006-01-02 15:04:05"), text)
}

func (d *daemon) limits(entry map[string]any) {
	if d.threadPercentage == nil {
		entry["default_active_thread_percentage"] = nil
	} else {
		entry["default_active_thread_percentage"] = *d.threadPercentage
	}
	pinned := map[string]any{}
	for uuid, value := range d.pinned {
		pinned[uuid] = value
	}
	entry["default_pinned_mem_limits"] = pinned
}

// record updates this daemon's record file (mps_records.py's format): `<key>.json` while it runs, then
// `<key>.stopped.json`, dropping the oldest stopped records beyond keepStopped. Only this daemon writes its
// file (temp file and rename), so no lock is taken and the simulator state is left alone.
func (d *daemon) record(changes map[string]any) {
	if d.store == nil {
		return
	}
	for k, v := range changes {
		d.entry[k] = v
	}
	d.limits(d.entry)
	dir := filepath.Join(d.store.root, recordsDir)
	sum := sha256.Sum256([]byte(d.pipeDir))
	key := hex.EncodeToString(sum[:])[:24]
	if d.entry["running"] == true {
		_ = writeJSON(filepath.Join(dir, key+".json"), d.entry)
		return
	}
	if writeJSON(filepath.Join(dir, key+".stopped.json"), d.entry) != nil {
		return
	}
	_ = os.Remove(filepath.Join(dir, key+".json"))
	items, _ := os.ReadDir(dir)
	type stoppedRecord struct {
		mtime int64
		path  string
	}
	var stopped []stoppedRecord
	for _, item := range items {
		if strings.HasSuffix(item.Name(), ".stopped.json") {
			if info, err := item.Info(); err == nil {
				stopped = append(stopped, stoppedRecord{info.ModTime().UnixNano(), filepath.Join(dir, item.Name())})
			}
		}
	}
	sort.Slice(stopped, func(i, j int) bool {
		if stopped[i].mtime != stopped[j].mtime {
			return stopped[i].mtime < stopped[j].mtime
		}
		return stopped[i].path < stopped[j].path
	})
	for i := 0; i < len(stopped)-keepStopped; i++ {
		_ = os.Remove(stopped[i].path)
	}
}

// writeJSON replaces path with value as compact JSON with sorted keys, as json.dumps(sort_keys=True) writes.
func writeJSON(path string, value any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o777); err != nil {
		return err
	}
	var buffer bytes.Buffer
	encoder := json.NewEncoder(&buffer)
	encoder.SetEscapeHTML(false) // maps are encoded with sorted keys
	if err := encoder.Encode(value); err != nil {
		return err
	}
	out := bytes.TrimRight(buffer.Bytes(), "\n")
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%d.tmp", filepath.Base(path), os.Getpid()))
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (d *daemon) recordCommand(line string, ok bool) {
	commands, _ := d.entry["commands"].([]any)
	d.entry["commands"] = append(commands, map[string]any{"command": line, "ok": ok})
	d.record(nil)
}

func (d *daemon) device(spec string) (string, error) {
	for _, uuid := range d.visible {
		if uuid == spec {
			return spec, nil
		}
	}
	if index, err := strconv.Atoi(spec); err == nil && isDigits(spec) && index < len(d.visible) {
		return d.visible[index], nil
	}
	return "", fail("device %s is not visible to this daemon (CUDA_VISIBLE_DEVICES=%s)",
		pyRepr(spec), strings.Join(d.visible, ","))
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// handle answers one command: (answer, quit?, error).
func (d *daemon) handle(line string) (string, bool, error) {
	words := strings.Fields(line)
	if len(words) == 0 {
		return "", false, fail("empty command")
	}
	name, args := words[0], words[1:]
	switch {
	case name == "get_server_list" && len(args) == 0:
		return "", false, nil // no client has connected, so no MPS server runs yet
	case name == "set_default_active_thread_percentage" && len(args) == 1:
		value, err := threadPercentage(args[0])
		if err != nil {
			return "", false, err
		}
		d.threadPercentage = &value
		return fmt.Sprintf("%.1f", float64(value)), false, nil // the real tool answers "30.0"
	case name == "get_default_active_thread_percentage" && len(args) == 0:
		value := 100
		if d.threadPercentage != nil {
			value = *d.threadPercentage
		}
		return fmt.Sprintf("%.1f", float64(value)), false, nil
	case name == "set_default_device_pinned_mem_limit" && len(args) == 2:
		uuid, err := d.device(args[0])
		if err != nil {
			return "", false, err
		}
		if m := limitRE.FindStringSubmatch(args[1]); m == nil || isZero(m[1]) {
			return "", false, fail("invalid pinned memory limit %s: expected <N>M or <N>G, N > 0", pyRepr(args[1]))
		}
		d.pinned[uuid] = args[1]
		return "", false, nil
	case name == "get_default_device_pinned_mem_limit" && len(args) == 1:
		uuid, err := d.device(args[0])
		if err != nil {
			return "", false, err
		}
		value, ok := d.pinned[uuid]
		if !ok {
			return "", false, nil // unset: no answer
		}
		return asTheToolPrints(value), false, nil
	case name == "sim_get_visible_devices" && len(args) == 0: // simulator only: for the simulated client
		out, _ := json.Marshal(d.visible)
		return strings.ReplaceAll(string(out), `","`, `", "`), false, nil // as Python's json.dumps prints
	case name == "quit" && len(args) == 0:
		return "", true, nil
	}
	return "", false, fail("unknown command or wrong arguments: %s", pyRepr(line))
}

func isZero(digits string) bool { return strings.Trim(digits, "0") == "" }

// asTheToolPrints: `2048M` -> `2G`, as the real tool answers (whole GiB where it can; driver 580.159.04).
func asTheToolPrints(value string) string {
	m := limitRE.FindStringSubmatch(value)
	mebibytes, _ := strconv.ParseInt(m[1], 10, 64)
	if m[2] == "G" {
		mebibytes *= 1024
	}
	if mebibytes%1024 == 0 {
		return fmt.Sprintf("%dG", mebibytes>>10)
	}
	return fmt.Sprintf("%dM", mebibytes)
}

// threadPercentage: `30`, `40.5`; 0..100, rounded half to even as Python's round().
func threadPercentage(text string) (int, error) {
	value, err := strconv.ParseFloat(strings.TrimSpace(text), 64)
	if err != nil || math.IsNaN(value) || value < 0 || value > 100 {
		return 0, fail("invalid active thread percentage %s: expected 0..100", pyRepr(text))
	}
	return int(math.RoundToEven(value)), nil
}

func readLine(conn net.Conn) string {
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var data []byte
	buf := make([]byte, 4096)
	for !bytes.HasSuffix(data, []byte("\n")) && len(data) < 4096 {
		n, err := conn.Read(buf)
		data = append(data, buf[:n]...)
		if err != nil || n == 0 {
			break
		}
	}
	return strings.TrimSpace(string(data))
}

func (d *daemon) serve(listener net.Listener) {
	for {
		conn, err := listener.Accept()
		if err != nil {
			return // closed by SIGTERM
		}
		line := readLine(conn)
		answer, stop, err := d.handle(line)
		ok := err == nil
		if !ok {
			answer, stop = "ERROR: "+err.Error(), false
		}
		verb := "Received"
		if !ok {
			verb = "Rejected"
		}
		d.log(fmt.Sprintf("%s command: %s", verb, line))
		d.recordCommand(line, ok)
		if answer != "" {
			_, _ = conn.Write([]byte(answer + "\n"))
		}
		if !ok {
			_, _ = conn.Write([]byte{0}) // tells the client the command failed
		}
		conn.Close()
		if stop {
			return
		}
	}
}

func (d *daemon) run(listener net.Listener, ready *os.File) {
	_ = os.Chdir("/")
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM)
	go func() {
		<-signals
		listener.Close() // ends serve; the cleanup below runs as after `quit`
	}()
	pid := os.Getpid()
	_ = os.WriteFile(filepath.Join(d.pipeDir, pidFile), []byte(fmt.Sprintf("%d\n", pid)), 0o644)
	d.log(fmt.Sprintf("Starting control daemon pid %d for devices %s", pid, strings.Join(d.visible, ",")))
	visible := make([]any, len(d.visible))
	for i, uuid := range d.visible {
		visible[i] = uuid
	}
	d.record(map[string]any{
		"pid": pid, "running": true, "started": now(), "stopped": nil, "visible_devices": visible,
		"multi_user": d.multiUser, "pipe_dir": d.pipeDir, "log_dir": d.logDir, "commands": []any{},
	})
	if ready != nil {
		_, _ = ready.Write([]byte("1"))
		ready.Close()
	}
	d.serve(listener)
	listener.Close()
	_ = os.Remove(filepath.Join(d.pipeDir, socketName))
	_ = os.Remove(filepath.Join(d.pipeDir, pidFile))
	d.log("Shutting down control daemon")
	d.record(map[string]any{"running": false, "stopped": now()})
}

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

func dirs() (string, string) {
	pipeDir, logDir := os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), os.Getenv("CUDA_MPS_LOG_DIRECTORY")
	if pipeDir == "" {
		pipeDir = defaultPipeDir
	}
	if logDir == "" {
		logDir = defaultLogDir
	}
	return pipeDir, logDir
}

func newDaemon(multiUser bool) (*daemon, error) {
	pipeDir, logDir := dirs()
	var visible []string
	for _, part := range strings.Split(os.Getenv("CUDA_VISIBLE_DEVICES"), ",") {
		if part = strings.TrimSpace(part); part != "" {
			visible = append(visible, part)
		}
	}
	d := &daemon{pipeDir: pipeDir, logDir: logDir, visible: visible, store: openStore(), entry: map[string]any{},
		pinned: map[string]string{}, multiUser: multiUser}
	// The daemon-level default from its own environment (MPS docs 4.2.5); CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
	// there is ignored, as a real daemon ignores it.
	if text := strings.TrimSpace(os.Getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")); text != "" {
		value, err := threadPercentage(text)
		if err != nil {
			return nil, err
		}
		d.threadPercentage = &value
	}
	return d, nil
}

// withDir runs fn in dir: sockets are bound and reached by their relative name, so that a long pipe
// directory does not hit the 108-byte limit of socket paths.
func withDir(dir string, fn func() error) error {
	cwd, err := os.Getwd()
	if err != nil {
		return err
	}
	if err := os.Chdir(dir); err != nil {
		return err
	}
	defer os.Chdir(cwd)
	return fn()
}

func connect(pipeDir string) (net.Conn, error) {
	var conn net.Conn
	err := withDir(pipeDir, func() error {
		var err error
		conn, err = net.Dial("unix", socketName)
		return err
	})
	return conn, err
}

func answers(pipeDir string) bool {
	conn, err := connect(pipeDir)
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("get_server_list\n")); err != nil {
		return false
	}
	_, err = conn.Read(make([]byte, 4096))
	return err == nil || errors.Is(err, io.EOF)
}

func startDaemon(foreground, multiUser bool) int {
	d, err := newDaemon(multiUser)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if len(d.visible) == 0 {
		fmt.Fprintln(os.Stderr, "CUDA_VISIBLE_DEVICES is empty: the MPS control daemon needs the devices it serves")
		return 1
	}
	if d.store != nil {
		state, err := d.store.read()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		known := knownUUIDs(state)
		var unknown []string
		for _, uuid := range d.visible {
			if !known[uuid] {
				unknown = append(unknown, uuid)
			}
		}
		if len(unknown) > 0 {
			fmt.Fprintf(os.Stderr, "CUDA_VISIBLE_DEVICES names devices that do not exist: %s\n", strings.Join(unknown, ","))
			return 1
		}
	}
	for _, dir := range []string{d.pipeDir, d.logDir} {
		if err := os.MkdirAll(dir, 0o777); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if _, err := os.Stat(filepath.Join(d.pipeDir, pidFile)); err == nil && answers(d.pipeDir) {
		fmt.Fprintf(os.Stderr, "An instance of this daemon is already running (%s)\n", d.pipeDir)
		return 1
	}
	_ = os.Remove(filepath.Join(d.pipeDir, socketName))
	lockPath := filepath.Join(d.pipeDir, lockFile)
	if f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_WRONLY, 0o666); err == nil {
		f.Close()
	}
	_ = os.Chmod(lockPath, 0o666)
	// Bound before the daemon is detached, so that a failure is reported to the caller.
	var listener *net.UnixListener
	err = withDir(d.pipeDir, func() error {
		l, err := net.Listen("unix", socketName)
		if err != nil {
			return err
		}
		listener = l.(*net.UnixListener)
		// As a real daemon's (H100, driver 580.159.04): clients of any uid reach it.
		return os.Chmod(socketName, 0o666)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	listener.SetUnlinkOnClose(false) // the daemon owns the socket file, whichever process closes first
	if foreground {
		d.run(listener, nil)
		return 0
	}
	return detach(listener, multiUser)
}

// detach starts this binary again as the daemon in its own session, hands it the listener, and waits until
// it has written its pid.
func detach(listener *net.UnixListener, multiUser bool) int {
	listenerFile, err := listener.File()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	readEnd, writeEnd, err := os.Pipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	args := []string{daemonChildFlag}
	if multiUser {
		args = append(args, "-M")
	}
	child := exec.Command(self, args...)
	child.Args[0] = os.Args[0]
	child.ExtraFiles = []*os.File{listenerFile, writeEnd} // fds 3 and 4
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	writeEnd.Close()
	listenerFile.Close()
	listener.Close()
	_ = child.Process.Release()
	ready := make([]byte, 16)
	n, _ := readEnd.Read(ready)
	if n == 0 {
		return 1
	}
	return 0
}

func daemonChild(multiUser bool) int {
	d, err := newDaemon(multiUser)
	if err != nil {
		return 1
	}
	listener, err := net.FileListener(os.NewFile(3, "listener"))
	if err != nil {
		return 1
	}
	d.run(listener, os.NewFile(4, "ready"))
	return 0
}

// ------------------------------------------------------------------------------------------------ client

// runClient is one control session: every stdin line a command, in order, holding control_lock throughout
// (a real daemon serves one session at a time and refuses a second at once).
func runClient() int {
	pipeDir, _ := dirs()
	lock, err := os.Open(filepath.Join(pipeDir, lockFile))
	if err != nil {
		fmt.Fprintln(os.Stderr, notRunningMessage)
		return 1
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fmt.Fprintln(os.Stderr, busyMessage)
		return 1
	}
	status := 0
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		line := strings.TrimSpace(lines.Text())
		if line == "" {
			continue
		}
		conn, err := connect(pipeDir)
		if err != nil {
			fmt.Fprintln(os.Stderr, notRunningMessage)
			return 1
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = conn.Write([]byte(line + "\n"))
		reply, _ := io.ReadAll(conn)
		conn.Close()
		failed := bytes.HasSuffix(reply, []byte{0})
		text := bytes.TrimRight(reply, "\x00")
		if failed {
			os.Stderr.Write(text)
			status = 1
		} else {
			os.Stdout.Write(text)
		}
	}
	return status
}

func main() {
	args := os.Args[1:]
	multiUser := len(args) == 2 && args[1] == "-M"
	switch {
	case len(args) >= 1 && args[0] == daemonChildFlag:
		os.Exit(daemonChild(len(args) == 2 && args[1] == "-M"))
	case len(args) >= 1 && (args[0] == "-d" || args[0] == "-f") && (len(args) == 1 || multiUser):
		os.Exit(startDaemon(args[0] == "-f", multiUser))
	case len(args) > 0:
		fmt.Fprintln(os.Stderr, "usage: nvidia-cuda-mps-control -d|-f [-M]   (commands on stdin otherwise)")
		os.Exit(2)
	}
	os.Exit(runClient())
}
