//! An object store for tests: an HTTP server that keeps what is PUT and serves it to GETs, as
//! a bucket behind presigned URLs would. Paths under `/denied/` are refused with a 403.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Objects {
    by_path: Mutex<HashMap<String, Vec<u8>>>,
    gets: AtomicU64,
}

pub struct Bucket {
    pub port: u16,
    objects: Arc<Objects>,
}

impl Bucket {
    pub fn start() -> Bucket {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let port = listener.local_addr().expect("its address").port();
        let objects: Arc<Objects> = Arc::default();
        let served = Arc::clone(&objects);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let served = Arc::clone(&served);
                std::thread::spawn(move || {
                    let _ = serve_one(stream, &served);
                });
            }
        });
        Bucket { port, objects }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn object(&self, path: &str) -> Option<Vec<u8>> {
        self.objects.by_path.lock().expect("objects").get(path).cloned()
    }

    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        self.objects
            .by_path
            .lock()
            .expect("objects")
            .insert(path.to_string(), bytes);
    }

    /// How many GETs found their object.
    pub fn gets(&self) -> u64 {
        self.objects.gets.load(Ordering::SeqCst)
    }
}

fn serve_one(stream: TcpStream, objects: &Objects) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    let mut words = request_line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or("").to_string());
    let (status, answer) = if path.starts_with("/denied/") {
        ("403 Forbidden", Vec::new())
    } else if method == "PUT" {
        objects.by_path.lock().expect("objects").insert(path, body);
        ("200 OK", Vec::new())
    } else if method == "GET" {
        match objects.by_path.lock().expect("objects").get(&path).cloned() {
            Some(found) => {
                objects.gets.fetch_add(1, Ordering::SeqCst);
                ("200 OK", found)
            }
            None => ("404 Not Found", Vec::new()),
        }
    } else {
        ("405 Method Not Allowed", Vec::new())
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        answer.len()
    )?;
    stream.write_all(&answer)?;
    stream.flush()
}
