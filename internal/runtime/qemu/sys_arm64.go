package qemu

const sysMemfdCreate = 279
