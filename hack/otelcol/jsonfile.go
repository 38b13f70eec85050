package main

import (
	"context"
	"errors"
	"os"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// The jsonfile exporter appends every batch of spans it receives to a file, one OTLP/JSON
// ExportTraceServiceRequest per line, written in full before ConsumeTraces returns (the
// OTLP receiver answers the sender only then): a test that got its export acknowledged can
// read the spans at once. It stands in for the contrib file exporter, whose dependencies the
// Go module proxy does not serve in full.

type jsonFileConfig struct {
	Path string `mapstructure:"path"`
}

func (c *jsonFileConfig) Validate() error {
	if c.Path == "" {
		return errors.New("path must be set")
	}
	return nil
}

type jsonFileExporter struct {
	path string
	mu   sync.Mutex
	file *os.File
}

func newJSONFileFactory() exporter.Factory {
	return exporter.NewFactory(
		component.MustNewType("jsonfile"),
		func() component.Config { return &jsonFileConfig{} },
		exporter.WithTraces(createJSONFile, component.StabilityLevelDevelopment),
	)
}

func createJSONFile(_ context.Context, _ exporter.Settings, cfg component.Config) (exporter.Traces, error) {
	return &jsonFileExporter{path: cfg.(*jsonFileConfig).Path}, nil
}

func (e *jsonFileExporter) Start(context.Context, component.Host) error {
	file, err := os.OpenFile(e.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	e.file = file
	return nil
}

func (e *jsonFileExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.file == nil {
		return nil
	}
	err := e.file.Close()
	e.file = nil
	return err
}

func (e *jsonFileExporter) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: false}
}

func (e *jsonFileExporter) ConsumeTraces(_ context.Context, td ptrace.Traces) error {
	marshaler := ptrace.JSONMarshaler{}
	line, err := marshaler.MarshalTraces(td)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.file == nil {
		return errors.New("jsonfile exporter is not started")
	}
	_, err = e.file.Write(append(line, '\n'))
	return err
}
