module github.com/airlock-sandbox/airlock/sdk/go

go 1.26
