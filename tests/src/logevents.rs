//! The gateway's log lines read back as the event table's events (sparkgate-events): each
//! line's level and, where it has one, its `event` name — so a test can hold what a fault
//! logged to the table (one WARN per unplanned event, INFO for planned ones).

/// One log line: its level, its event's name (absent for a line outside the table) and the
/// line itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub level: String,
    pub event: Option<String>,
    pub text: String,
}

impl Line {
    /// A WARN or ERROR line.
    pub fn loud(&self) -> bool {
        matches!(self.level.as_str(), "WARN" | "ERROR")
    }

    pub fn is(&self, event: &str) -> bool {
        self.event.as_deref() == Some(event)
    }
}

/// The log's lines that are the gateway's own (a timestamp, then a level), parsed.
pub fn parse(log: &[String]) -> Vec<Line> {
    log.iter().filter_map(|l| line(l)).collect()
}

fn line(text: &str) -> Option<Line> {
    let mut words = text.split_whitespace();
    let stamp = words.next()?;
    let level = words.next()?;
    let is_level = matches!(level, "TRACE" | "DEBUG" | "INFO" | "WARN" | "ERROR");
    if !(stamp.len() > 20 && stamp.ends_with('Z') && is_level) {
        return None;
    }
    let event = text.split(" event=").nth(1).map(|rest| {
        rest.split_whitespace()
            .next()
            .unwrap_or("")
            .trim_matches('"')
            .to_owned()
    });
    Some(Line {
        level: level.to_owned(),
        event,
        text: text.to_owned(),
    })
}

/// The lines naming `event`.
pub fn named<'a>(lines: &'a [Line], event: &str) -> Vec<&'a Line> {
    lines.iter().filter(|l| l.is(event)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_read_as_its_level_and_event() {
        let log = vec![
            "2026-12-06T07:50:01.123456Z  WARN group main: epoch 1 lost (killed): x; restarting event=\"group_lost\""
                .to_owned(),
            "2026-12-06T07:50:01.123456Z  INFO generation route=\"chat\" status=200".to_owned(),
            "vllm-sim: a rank's own line".to_owned(),
        ];
        let lines = parse(&log);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].loud() && lines[0].is("group_lost"));
        assert_eq!((lines[1].level.as_str(), lines[1].event.as_deref()), ("INFO", None));
    }
}
