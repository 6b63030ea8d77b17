// Command kubelet-client plays kubelet against a DRA driver's sockets with the real grpc-go
// library, so the Rust tests see exactly what kubelet's transport sends (notably the
// percent-encoded socket path as :authority).
//
// It dials the registration socket by its bare path the way kubelet's plugin watcher does
// (grpc.DialContext, blocking, custom unix dialer, no WithAuthority), calls GetInfo, checks the
// answer like kubelet's DRA handler, reports NotifyRegistrationStatus, then dials the endpoint
// it was given and calls NodePrepareResources and NodeUnprepareResources on the DRA services
// v1 and v1beta1. The endpoint is dialled twice: by bare path (the 1.34-era kubelet) and as
// "unix:<path>" with grpc.NewClient (current kubelet).
//
// Messages are encoded with protowire by hand, so no generated Go code is needed; the field
// numbers are those of the project's proto/ files. Every call prints one JSON line on stdout;
// the exit status is non-zero if any call failed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

// rawCodec hands pre-encoded protobuf bytes to grpc-go unchanged.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// field is one decoded protobuf field: a varint or a length-delimited payload.
type field struct {
	num    protowire.Number
	varint uint64
	bytes  []byte
}

func parseFields(b []byte) ([]field, error) {
	var out []field
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		f := field{num: num}
		switch typ {
		case protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			f.varint, b = v, b[m:]
		case protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			f.bytes, b = v, b[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			b = b[m:]
		}
		out = append(out, f)
	}
	return out, nil
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// pluginInfo mirrors pluginregistration.PluginInfo.
type pluginInfo struct {
	Type              string   `json:"type"`
	Name              string   `json:"name"`
	Endpoint          string   `json:"endpoint"`
	SupportedVersions []string `json:"supported_versions"`
}

func decodePluginInfo(b []byte) (pluginInfo, error) {
	fields, err := parseFields(b)
	if err != nil {
		return pluginInfo{}, err
	}
	var info pluginInfo
	for _, f := range fields {
		switch f.num {
		case 1:
			info.Type = string(f.bytes)
		case 2:
			info.Name = string(f.bytes)
		case 3:
			info.Endpoint = string(f.bytes)
		case 4:
			info.SupportedVersions = append(info.SupportedVersions, string(f.bytes))
		}
	}
	return info, nil
}

// device mirrors the DRA Device message (share_id only exists in v1).
type device struct {
	RequestNames []string `json:"request_names"`
	PoolName     string   `json:"pool_name"`
	DeviceName   string   `json:"device_name"`
	CDIDeviceIDs []string `json:"cdi_device_ids"`
	ShareID      *string  `json:"share_id,omitempty"`
}

// claimResult is one value of the per-claim response maps.
type claimResult struct {
	Devices []device `json:"devices,omitempty"`
	Error   string   `json:"error"`
}

func decodeDevice(b []byte) (device, error) {
	fields, err := parseFields(b)
	if err != nil {
		return device{}, err
	}
	var d device
	for _, f := range fields {
		switch f.num {
		case 1:
			d.RequestNames = append(d.RequestNames, string(f.bytes))
		case 2:
			d.PoolName = string(f.bytes)
		case 3:
			d.DeviceName = string(f.bytes)
		case 4:
			d.CDIDeviceIDs = append(d.CDIDeviceIDs, string(f.bytes))
		case 5:
			s := string(f.bytes)
			d.ShareID = &s
		}
	}
	return d, nil
}

// decodeClaimMap decodes field 1 (map<string, Node(Un)PrepareResourceResponse>) of a DRA
// response. prepare selects the value layout: devices=1, error=2 for prepare; error=1 for
// unprepare.
func decodeClaimMap(b []byte, prepare bool) (map[string]claimResult, error) {
	fields, err := parseFields(b)
	if err != nil {
		return nil, err
	}
	out := map[string]claimResult{}
	for _, f := range fields {
		if f.num != 1 {
			continue
		}
		entry, err := parseFields(f.bytes)
		if err != nil {
			return nil, err
		}
		var key string
		var value []byte
		for _, e := range entry {
			switch e.num {
			case 1:
				key = string(e.bytes)
			case 2:
				value = e.bytes
			}
		}
		valueFields, err := parseFields(value)
		if err != nil {
			return nil, err
		}
		var r claimResult
		for _, v := range valueFields {
			switch {
			case prepare && v.num == 1:
				d, err := decodeDevice(v.bytes)
				if err != nil {
					return nil, err
				}
				r.Devices = append(r.Devices, d)
			case prepare && v.num == 2, !prepare && v.num == 1:
				r.Error = string(v.bytes)
			}
		}
		out[key] = r
	}
	return out, nil
}

// claimsRequest encodes Node(Un)PrepareResourcesRequest{claims: [{namespace, uid, name}]}.
func claimsRequest(namespace, uid, name string) []byte {
	var claim []byte
	claim = appendString(claim, 1, namespace)
	claim = appendString(claim, 2, uid)
	claim = appendString(claim, 3, name)
	return appendBytes(nil, 1, claim)
}

// report is the JSON line printed for every call.
type report struct {
	Call    string                 `json:"call"`
	Version string                 `json:"version,omitempty"`
	Dial    string                 `json:"dial,omitempty"`
	OK      bool                   `json:"ok"`
	Error   string                 `json:"error,omitempty"`
	Info    *pluginInfo            `json:"info,omitempty"`
	Claims  map[string]claimResult `json:"claims,omitempty"`
}

func emit(r report) {
	line, err := json.Marshal(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-client: cannot encode report:", err)
		os.Exit(3)
	}
	fmt.Println(string(line))
}

func unixDialer(ctx context.Context, addr string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "unix", addr)
}

// dialBarePath dials like kubelet's plugin watcher (and the 1.34-era DRA client): the bare
// socket path as target, so grpc-go derives :authority from the path.
func dialBarePath(path string, timeout time.Duration) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	//nolint:staticcheck // DialContext is what kubelet's plugin watcher calls.
	return grpc.DialContext(ctx, path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(unixDialer),
	)
}

// dialUnixScheme dials like the current kubelet DRA client: grpc.NewClient("unix:"+path).
func dialUnixScheme(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func invoke(conn *grpc.ClientConn, method string, req []byte, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var resp []byte
	err := conn.Invoke(ctx, method, &req, &resp, grpc.ForceCodec(rawCodec{}))
	return resp, err
}

func main() {
	registration := flag.String("registration", "", "path of the registration socket")
	driver := flag.String("driver", "", "expected driver name")
	notifyError := flag.String("notify-error", "", "report registration failure with this message")
	namespace := flag.String("claim-namespace", "default", "namespace of the test claim")
	uid := flag.String("claim-uid", "uid-1", "UID of the test claim")
	name := flag.String("claim-name", "claim-1", "name of the test claim")
	flag.Parse()
	if *registration == "" {
		fmt.Fprintln(os.Stderr, "kubelet-client: -registration is required")
		os.Exit(2)
	}
	if err := run(*registration, *driver, *notifyError, *namespace, *uid, *name); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-client:", err)
		os.Exit(1)
	}
}

func run(registration, driver, notifyError, namespace, uid, name string) error {
	// Kubelet: 10 s blocking dial, 1 s GetInfo timeout.
	conn, err := dialBarePath(registration, 10*time.Second)
	if err != nil {
		emit(report{Call: "Dial", Dial: "bare", Error: err.Error()})
		return err
	}
	defer conn.Close()

	raw, err := invoke(conn, "/pluginregistration.Registration/GetInfo", nil, time.Second)
	if err != nil {
		emit(report{Call: "GetInfo", Error: err.Error()})
		return err
	}
	info, err := decodePluginInfo(raw)
	if err != nil {
		emit(report{Call: "GetInfo", Error: err.Error()})
		return err
	}
	emit(report{Call: "GetInfo", OK: true, Info: &info})

	// Kubelet's DRA handler: right type and name, first supported service in the plugin's order.
	validation := ""
	switch {
	case info.Type != "DRAPlugin":
		validation = fmt.Sprintf("unexpected plugin type %q", info.Type)
	case driver != "" && info.Name != driver:
		validation = fmt.Sprintf("unexpected driver name %q", info.Name)
	default:
		supported := false
		for _, v := range info.SupportedVersions {
			if v == "v1.DRAPlugin" || v == "v1beta1.DRAPlugin" {
				supported = true
				break
			}
		}
		if !supported {
			validation = fmt.Sprintf("none of %q is supported", info.SupportedVersions)
		}
	}
	if notifyError == "" {
		notifyError = validation
	}
	var status []byte
	if notifyError == "" {
		status = protowire.AppendTag(status, 1, protowire.VarintType)
		status = protowire.AppendVarint(status, 1)
	} else {
		status = appendString(status, 2, notifyError)
	}
	if _, err := invoke(conn, "/pluginregistration.Registration/NotifyRegistrationStatus", status, 5*time.Second); err != nil {
		emit(report{Call: "NotifyRegistrationStatus", Error: err.Error()})
		return err
	}
	emit(report{Call: "NotifyRegistrationStatus", OK: true})
	if validation != "" {
		return errors.New(validation)
	}
	if notifyError != "" {
		return nil
	}

	var failed error
	for _, dial := range []string{"bare", "unix"} {
		var dra *grpc.ClientConn
		if dial == "bare" {
			dra, err = dialBarePath(info.Endpoint, 10*time.Second)
		} else {
			dra, err = dialUnixScheme(info.Endpoint)
		}
		if err != nil {
			emit(report{Call: "Dial", Dial: dial, Error: err.Error()})
			failed = err
			continue
		}
		for _, version := range []string{"v1", "v1beta1"} {
			service := "/k8s.io.kubelet.pkg.apis.dra." + version + ".DRAPlugin/"
			for _, call := range []string{"NodePrepareResources", "NodeUnprepareResources"} {
				// Kubelet: 45 s per DRA call.
				raw, err := invoke(dra, service+call, claimsRequest(namespace, uid, name), 45*time.Second)
				r := report{Call: call, Version: version, Dial: dial}
				if err == nil {
					r.Claims, err = decodeClaimMap(raw, call == "NodePrepareResources")
				}
				if err != nil {
					r.Error = err.Error()
					failed = err
				} else {
					r.OK = true
				}
				emit(r)
			}
		}
		dra.Close()
	}
	return failed
}
